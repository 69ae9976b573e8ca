"""The Kafka and PostgreSQL sinks as outputs of the fault shapes (tests/faults/shapes.py ``EXTERNAL_SINKS``).

A shape's output folder names its output: a topic (3 partitions) on the session's Apache Kafka broker, a
table in a database of the session's PostgreSQL server. What the Kafka sink committed is what a plain
``read_committed`` consumer reads (tests/kafka_test_broker.py): nothing deduplicated, a record committed twice
counts twice.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pyarrow as pa
from sluice.sink import Sink

from tests.apache_kafka import ApacheKafkaBroker
from tests.faults.shapes import EXTERNAL_SINKS, rows_of
from tests.postgres_server import PostgresServer

__all__ = ["use_kafka", "use_postgres"]


def _name(out: str) -> str:
    return hashlib.sha256(out.encode()).hexdigest()[:16]


def use_kafka(broker: ApacheKafkaBroker) -> None:
    """Register ``sink="kafka"``: exactly-once into topic ``faults-<hash of the output folder>``, read back by
    the broker's plain ``read_committed`` reader."""
    from sluice.sinks.kafka import KafkaSink

    def make(out: str) -> Sink[Any]:
        topic = f"faults-{_name(out)}"
        if topic not in broker.admin.list_topics(timeout=30).topics:
            broker.create_topic(topic, 3)
        return KafkaSink(broker.bootstrap, topic)

    def rows(out: str) -> list[tuple[Any, ...]]:
        topic = f"faults-{_name(out)}"
        if topic not in broker.admin.list_topics(timeout=30).topics:
            return []
        values = [json.loads(r.value) for r in broker.read_committed(topic) if r.value is not None]
        return rows_of(pa.Table.from_pylist(values) if values else None)

    EXTERNAL_SINKS["kafka"] = (make, rows)


def use_postgres(pg: PostgresServer, conninfo: str) -> None:
    """Register ``sink="postgres"`` and ``sink="postgres_upsert"``: exactly-once appends, or upserts by
    ``id``, into table ``f_<hash of the output folder>``."""
    from sluice.sinks.postgres import PostgresSink

    def make(out: str) -> Sink[Any]:
        return PostgresSink(conninfo, f"f_{_name(out)}")

    def make_upsert(out: str) -> Sink[Any]:
        return PostgresSink(conninfo, f"f_{_name(out)}", mode="upsert", key_columns=["id"])

    def rows(out: str) -> list[tuple[Any, ...]]:
        table = f"f_{_name(out)}"
        import psycopg

        with psycopg.connect(conninfo, autocommit=True) as conn:
            if conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0] is None:  # type: ignore[index]
                return []
            cur = conn.execute(f"SELECT * FROM {table}")
            names = [d.name for d in cur.description or []]
            data = cur.fetchall()
        return rows_of(pa.Table.from_pylist([dict(zip(names, r, strict=True)) for r in data]) if data else None)

    EXTERNAL_SINKS["postgres"] = (make, rows)
    EXTERNAL_SINKS["postgres_upsert"] = (make_upsert, rows)
