"""The Kafka source's formats, by name (``format="json"``), and the decoder protocol ``format=`` also takes.

Adding a format is one new module here with a :class:`~.base.Format` subclass (its name, the options it
reads, its build-time checks, its decoder) and one entry in :data:`FORMATS`. A decoder is anything with
``decode_messages(Messages) -> Decoded`` (:class:`~.base.Decoder`, whose docstring states the bad-record
contract); formats that decode values alone derive from :class:`~.base.ValueDecoder`.
"""

from __future__ import annotations

import copy

from sluice.connectors.kafka.formats.avro import AvroFormat
from sluice.connectors.kafka.formats.base import (
    Decoded,
    Decoder,
    Format,
    FormatOptions,
    ValueDecoder,
)
from sluice.connectors.kafka.formats.change_options import DebeziumOptions, UpsertOptions
from sluice.connectors.kafka.formats.csv import CsvFormat
from sluice.connectors.kafka.formats.debezium import DebeziumAvroFormat, DebeziumJsonFormat
from sluice.connectors.kafka.formats.json import JsonFormat
from sluice.connectors.kafka.formats.messages import Messages
from sluice.connectors.kafka.formats.raw import RawFormat
from sluice.connectors.kafka.formats.upsert import UpsertAvroFormat, UpsertJsonFormat

__all__ = [
    "FORMATS",
    "DebeziumOptions",
    "Decoded",
    "Decoder",
    "Format",
    "FormatOptions",
    "Messages",
    "UpsertOptions",
    "ValueDecoder",
    "format_names",
    "make_decoder",
]

#: every named format, in the order error messages list them
FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        RawFormat(),
        JsonFormat(),
        CsvFormat(),
        AvroFormat(),
        DebeziumJsonFormat(),
        DebeziumAvroFormat(),
        UpsertJsonFormat(),
        UpsertAvroFormat(),
    )
}


def format_names(option: str | None = None) -> str:
    """The names of the formats (that read ``option``), as error messages list them."""
    if option is None:
        return repr(tuple(FORMATS))
    return " or ".join(repr(n) for n in sorted(n for n, f in FORMATS.items() if option in f.takes))


def make_decoder(options: FormatOptions) -> Decoder:
    """A new decoder for one reader: the named format's, or a copy of the decoder given as ``format``."""
    if isinstance(options.format, str):
        return FORMATS[options.format].decoder(options)
    return copy.deepcopy(options.format)
