"""Kafka source connector: topic partitions as splits, exactly-once positions in sluice checkpoints.

Example::

    src = KafkaSource("broker:9092", ["orders"], format="json", schema=ORDER_SCHEMA,
                      on_bad_record="dead_letter", event_time="kafka", max_out_of_orderness_ms=5_000)
    orders = p.source(src, parallelism=4)
    orders.side_output("dead_letters").sink(FileSink("/data/dead-letters", format="parquet"))
    orders.sink(FileSink("/data/orders", format="parquet"))

Avro through a schema registry (Confluent wire format)::

    src = KafkaSource("broker:9092", "orders", format="avro",
                      schema_registry=SchemaRegistry("https://registry:8081", username="key", password=secret),
                      on_bad_record="dead_letter")

See ``docs/kafka.md`` for every option, the formats, the guarantees and known broker quirks.
"""

from sluice.connectors.kafka.errors import (
    IncompatibleSchemaError,
    KafkaDataLossError,
    KafkaSourceError,
    SchemaNotFoundError,
    SchemaRegistryError,
    UnsupportedSchemaError,
)
from sluice.connectors.kafka.formats.schema_registry import SchemaRegistry
from sluice.connectors.kafka.offsets import OffsetsInitializer
from sluice.connectors.kafka.source import KafkaSource

__all__ = [
    "IncompatibleSchemaError",
    "KafkaDataLossError",
    "KafkaSource",
    "KafkaSourceError",
    "OffsetsInitializer",
    "SchemaNotFoundError",
    "SchemaRegistry",
    "SchemaRegistryError",
    "UnsupportedSchemaError",
]
