"""Helpers of the Kafka connector tests: JSON records and the committed output."""

from __future__ import annotations

import json

import pyarrow as pa

from tests.kafka_test_broker import KafkaTestBroker


def json_values(n: int, start: int = 0, partition: int = 0) -> list[bytes]:
    """``n`` JSON records ``{"id": i, "p": partition, "ts": ...}`` with ids ``start..start+n``."""
    return [
        json.dumps({"id": i, "p": partition, "ts": 1_700_000_000_000 + i}).encode()
        for i in range(start, start + n)
    ]


def produce_json(broker: KafkaTestBroker, topic: str, per_partition: dict[int, range]) -> list[int]:
    """Produce ``{"id": i}`` records to each partition (tansu or Apache Kafka); returns every id produced."""
    ids: list[int] = []
    for p, r in per_partition.items():
        broker.produce(topic, json_values(len(r), r.start, p), partition=p)
        ids.extend(r)
    return ids


def committed_ids(table: pa.Table | None, column: str = "id") -> list[int]:
    """Sorted values of ``column`` in a committed table (empty if nothing committed)."""
    return sorted(table.column(column).to_pylist()) if table is not None else []
