"""The schema registry's wire format (Avro, JSON Schema) and plain Avro decoded by the native reader.

The Python decoder (:class:`~.formats.wire.WireDecoder`) stays in charge of the registry and of schema
evolution: which schema ids exist, the reader schema (Avro: the newest id, or ``avro_schema``), the
stream's widened schema (JSON Schema), the ids whose records are bad. :class:`WireTable` tells the native
consumer that state after each batch Python decoded -- per id, how to decode it (the JSON Schema's Arrow
schema; the Avro writer schema and the reader schema) or the error its records get -- and the schema
every batch is aligned to. The native side decodes a batch only if it knows every id in it; a batch
with another id comes back undecoded and Python decodes it (fetching the schema), then updates the table.
So no record is lost or moved, and the first batch, and the first one with each new id, decode in Python.

An id the native side cannot decode as Python would (an Avro schema arrow-avro reads into other types, or
cannot resolve to the reader schema) is refused there, and the batches that have it decode in Python.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from sluice.connectors.kafka.errors import IncompatibleSchemaError
from sluice.connectors.kafka.formats import Decoded, Decoder
from sluice.connectors.kafka.formats.avro import AvroDecoder
from sluice.connectors.kafka.formats.json import JsonSchemaDecoder
from sluice.connectors.kafka.formats.schemas import align, widen

__all__ = ["RECORDS", "WireTable", "framing"]

log = logging.getLogger("sluice.kafka")

#: records of wire-format batches by where they were decoded ("native", "python"), in this process
RECORDS: Counter[str] = Counter()

Table = tuple[pa.Schema, list[tuple[int, pa.Schema]], list[tuple[int, str, str | None, str]], list[tuple[int, str]]]


def framing(decoder: Decoder) -> bool | None:
    """Whether ``decoder``'s values carry the wire format's header (True), are plain Avro (False), or are
    not decoded natively this way (None)."""
    if type(decoder) is AvroDecoder:
        return decoder.registry is not None
    if type(decoder) is JsonSchemaDecoder:
        return True
    return None


def _json_table(d: JsonSchemaDecoder) -> Table | None:
    stream = d.stream_schema
    if stream is None:
        return None
    json: list[tuple[int, pa.Schema]] = []
    bad: list[tuple[int, str]] = []
    for sid, writer in sorted(d.writers.items()):
        try:
            wider = widen(stream, writer.schema)
        except IncompatibleSchemaError as exc:
            bad.append((sid, f"schema id {sid} is incompatible with the earlier ones: {exc}"))
            continue
        if wider.equals(stream):  # else its records would widen the stream: Python decodes them
            json.append((sid, writer.schema))
    return stream, json, [], bad


def _avro_table(d: AvroDecoder) -> Table | None:
    reader = d.reader_schema
    if reader is None:
        return None
    writers = d.writers.items() if d.registry is not None else [(0, reader)]
    avro = [
        (sid, w.text, None if w.key == reader.key else reader.text, w.label) for sid, w in sorted(writers)
    ]
    return reader.logical, [], avro, []


class WireTable:
    """Keeps a native consumer's table of schema ids in step with ``decoder``.

    Args:
        decoder: the reader's wire decoder (the one :func:`framing` accepts).
        configure: the native consumer's ``configure_wire``.
    """

    def __init__(self, decoder: Decoder, configure: Callable[..., list[tuple[int, str]]]) -> None:
        self.decoder = decoder
        self._configure = configure
        self._key: Any = None
        #: ids the native side refused, with why (their batches decode in Python)
        self.refused: dict[int, str] = {}

    def _state(self) -> Any:
        d = self.decoder
        if isinstance(d, JsonSchemaDecoder):
            return frozenset(d.writers), d.stream_schema
        assert isinstance(d, AvroDecoder)
        reader = d.reader_schema
        return frozenset(d.writers), None if reader is None else (reader.schema_id, reader.key)

    def update(self) -> None:
        """Tell the native side the decoder's state, if it changed since the last call."""
        key = self._state()
        if self._key is not None and key == self._key:
            return
        d = self.decoder
        table = _json_table(d) if isinstance(d, JsonSchemaDecoder) else _avro_table(d)  # type: ignore[arg-type]
        if table is None:
            return
        refused = dict(self._configure(*table))
        self._key = key
        for sid, why in refused.items():
            if sid not in self.refused:
                log.info("native reader: schema id %d decodes in Python (%s)", sid, why)
        self.refused = refused

    def finish(self, decoded: Decoded) -> Decoded:
        """A natively decoded batch as the Python decoder returns it (aligned to the ``schema`` option)."""
        output = getattr(self.decoder, "output", None)
        if output is not None and decoded.batch is not None:
            decoded.batch = align(decoded.batch, output)
        return decoded
