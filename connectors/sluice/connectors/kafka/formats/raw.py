"""The ``raw`` format: each message as a row of its fields (key, value, headers, topic, partition, offset,
timestamp), values of any size, nothing decoded."""

from __future__ import annotations

import pyarrow as pa
from sluice.connectors.kafka.formats.base import Decoded, Format, FormatOptions
from sluice.connectors.kafka.formats.messages import HEADERS, TIMESTAMP, Messages, timestamp_column
from sluice.errors import ConfigError

__all__ = ["RAW_SCHEMA", "RawDecoder", "RawFormat", "raw_batch"]

#: the columns of the ``raw`` format
RAW_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", HEADERS),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", TIMESTAMP),
    ]
)


def raw_batch(messages: Messages) -> pa.RecordBatch:
    """The ``raw`` format of ``messages``: key, value, headers, topic, partition, offset, timestamp."""
    return pa.RecordBatch.from_arrays(
        [
            messages.key_column(),
            messages.value_column(),
            messages.headers_column(),
            messages.topics(),
            pa.array(messages.partitions),
            pa.array(messages.offsets),
            timestamp_column(messages.timestamps()),
        ],
        names=RAW_SCHEMA.names,
    )


class RawDecoder:
    """Every message is one row of :data:`RAW_SCHEMA` (null values included: nothing is bad)."""

    def decode_messages(self, messages: Messages) -> Decoded:
        return Decoded(raw_batch(messages))


class RawFormat(Format):
    """``format="raw"`` (the default): the message fields as columns."""

    name = "raw"

    def check(self, options: FormatOptions) -> None:
        if options.value_schema is not None or options.include_metadata:
            raise ConfigError(
                "KafkaSource: schema and include_metadata apply to formats 'json', 'csv' and 'avro' "
                "(format 'raw' already has the metadata columns)"
            )
        if options.event_time not in (None, "kafka", "timestamp"):
            raise ConfigError(
                f"KafkaSource: event_time must be 'kafka' or None for format 'raw' (got {options.event_time!r})"
            )

    def decoder(self, options: FormatOptions) -> RawDecoder:
        return RawDecoder()

    def output_schema(self, options: FormatOptions) -> pa.Schema | None:
        return RAW_SCHEMA
