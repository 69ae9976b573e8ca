"""The Kafka and PostgreSQL sinks as outputs of the fault shapes (tests/faults/shapes.py ``EXTERNAL_SINKS``).

A shape's output folder names its output: a topic (3 partitions) on the session's tansu broker, a table in a
database of the session's PostgreSQL server. The Kafka sink tags records with its lineage header so the rows
it committed are read per tests/sinks/kafka/reader.py (tansu delivers aborted transactions' records to
read_committed readers).
"""

from __future__ import annotations

import hashlib
from typing import Any

import pyarrow as pa
from sluice.sink import Sink

from tests.faults.shapes import EXTERNAL_SINKS, rows_of
from tests.kafka_broker import TansuBroker
from tests.postgres_server import PostgresServer
from tests.sinks.kafka.reader import HEADER, read_committed

__all__ = ["use_kafka", "use_postgres"]


def _name(out: str) -> str:
    return hashlib.sha256(out.encode()).hexdigest()[:16]


def use_kafka(broker: TansuBroker) -> None:
    """Register ``sink="kafka"``: exactly-once into topic ``faults-<hash of the output folder>``."""
    from sluice.sinks.kafka import KafkaSink

    def make(out: str) -> Sink[Any]:
        topic = f"faults-{_name(out)}"
        if topic not in broker.admin.list_topics(timeout=30).topics:
            broker.create_topic(topic, 3)
        return KafkaSink(broker.bootstrap, topic, lineage_header=HEADER)

    def rows(out: str) -> list[tuple[Any, ...]]:
        topic = f"faults-{_name(out)}"
        if topic not in broker.admin.list_topics(timeout=30).topics:
            return []
        return rows_of(read_committed(broker, topic, finished=True).table())

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
