"""Kafka sink: rows as records of a topic, exactly once (write-ahead transactions with a marker), at least once,
or best effort; JSON, Avro and JSON Schema (schema registry wire format) or raw keys and values, headers,
partitioning by key or by a column. See ``docs/kafka_postgres.md``.
"""

from __future__ import annotations

from sluice.sinks.kafka.options import KafkaSinkOptions, RegistryOptions
from sluice.sinks.kafka.registry import SchemaRegistryError
from sluice.sinks.kafka.sink import KafkaSink
from sluice.sinks.kafka.transactions import KafkaCommittable

__all__ = ["KafkaCommittable", "KafkaSink", "KafkaSinkOptions", "RegistryOptions", "SchemaRegistryError"]
