"""``join_latest`` with its table read from a log-compacted topic of Apache Kafka after the log cleaner ran:
older values of a key and tombstoned keys are gone from the log, tombstones written since are still in it.

The reference is plain Python over what a plain ``read_committed`` consumer finds in the compacted topic
(not over what was produced) and the fact stream: each fact takes the last surviving record of its key
whose timestamp is at or before its own, none if that record is a tombstone (the event-time semantics of
docs/dedup_joins.md). tansu has no log cleaner (tests/broker_quirks/README.md), so this needs Apache Kafka.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from sluice.api import Pipeline
from sluice.connectors.kafka import KafkaSource
from sluice.sinks.testing import TwoPhaseCommitTestSink, read_committed

from tests.apache_kafka import COMPACTED_TOPIC, ApacheKafkaBroker
from tests.kafka_test_broker import Record

pytestmark = pytest.mark.kafka

T0 = 1_700_000_000_000
TABLE = pa.schema([("tier", pa.string())])
FACTS = pa.schema([("n", pa.int64()), ("cust", pa.int64()), ("ts", pa.int64())])


class _Table:
    """Writes the table topic: each record's CreateTime a second after the one before (a segment rolls at
    the first append whose record time is ``segment.ms`` past the segment's first record's)."""

    def __init__(self, broker: ApacheKafkaBroker, topic: str) -> None:
        self.topic, self.clock = topic, T0
        self.producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20, "log_level": 0})

    def write(self, rows: list[tuple[int, str | None]]) -> None:
        """``(key, tier)`` rows in one produce batch (a tier of None: a tombstone)."""
        for key, tier in rows:
            self.clock += 1000
            value = None if tier is None else json.dumps({"tier": tier}).encode()
            self.producer.produce(self.topic, value, key=json.dumps(key).encode(), partition=0, timestamp=self.clock)
        assert self.producer.flush(30) == 0


def _compacted(broker: ApacheKafkaBroker, table: _Table, until: Callable[[list[Record]], bool]) -> list[Record]:
    """Append one record at a time (the active segment is never cleaned: each append after ``segment.ms``
    rolls the one before it) until the cleaner has left what ``until`` wants."""
    deadline, roll = time.monotonic() + 120, 1000
    while time.monotonic() < deadline:
        table.write([(roll, "roll")])  # a key of its own: the reference joins no fact to it
        roll += 1
        survivors = broker.read_committed(table.topic)
        if until(survivors):
            return survivors
        time.sleep(0.2)
    raise AssertionError(f"the log cleaner did not compact {table.topic!r} in 120 s: {broker.cleaned_offsets(table.topic)}")


def _reference(survivors: list[Record], facts: list[dict[str, int]]) -> list[tuple[int, str, int]]:
    """``(fact n, tier, offset of the table record)`` of each fact joined (inner)."""
    by_key: dict[int, list[Record]] = {}
    for r in survivors:  # one partition: offset order
        by_key.setdefault(json.loads(r.key or b"null"), []).append(r)
    out = []
    for f in facts:
        before = [r for r in by_key.get(f["cust"], []) if r.timestamp <= f["ts"]]
        if before and before[-1].value is not None:
            out.append((f["n"], json.loads(before[-1].value)["tier"], before[-1].offset))
    return sorted(out)


def test_join_latest_on_a_compacted_topic_after_the_cleaner_ran(
    apache_kafka: ApacheKafkaBroker, kafka_topic: Callable[..., str], tmp_path: Path
) -> None:
    table_topic, facts_topic = kafka_topic(1, config=dict(COMPACTED_TOPIC)), kafka_topic(2)
    table = _Table(apache_kafka, table_topic)
    table.write([(k, f"v1-{k}") for k in range(30)])
    table.write([(k, f"v2-{k}") for k in range(10)])
    table.write([(k, None) for k in range(20, 30)])  # tombstones: the cleaner drops them with their keys
    written = 50

    def cleaned(survivors: list[Record]) -> bool:
        keys = [json.loads(r.key or b"null") for r in survivors]
        return (
            apache_kafka.cleaned_offsets(table_topic).get(0, 0) >= written
            and not any(20 <= k < 30 for k in keys)  # tombstones gone too (the cleaner's second pass)
            and keys.count(0) == 1
        )

    _compacted(apache_kafka, table, cleaned)
    # then, in the active segment (never cleaned): tombstones of keys that have a value, keys re-created
    # after their tombstones were cleaned, newer values
    table.write([*((k, None) for k in range(10, 15)), *((k, f"v3-{k}") for k in (0, 1, 20, 21, 22))])
    survivors = apache_kafka.read_committed(table_topic)
    values = {(json.loads(r.key or b"null"), None if r.value is None else json.loads(r.value)["tier"]) for r in survivors}
    assert not any(t is not None and t.startswith("v1-") and k < 10 for k, t in values), "older values are gone"
    assert not any(23 <= k < 30 for k, _ in values), "tombstoned keys are gone"
    assert sum(r.value is None for r in survivors) == 5, "the tombstones written after the cleaning are there"
    assert [r.timestamp for r in survivors] == sorted(r.timestamp for r in survivors)

    clock_end = table.clock
    times = [T0 + 20_000, T0 + 45_000, T0 + 55_000, clock_end - 3000, clock_end + 10**6]  # around the updates
    facts = [{"n": i * 10 + j, "cust": k, "ts": ts} for i, k in enumerate(range(35)) for j, ts in enumerate(times)]
    apache_kafka.produce(facts_topic, [json.dumps(f).encode() for f in facts])

    p = Pipeline("join-compacted", parallelism=2, checkpoint={"interval": 0.2, "storage": str(tmp_path / "chk")})
    dims = p.source(KafkaSource(apache_kafka.bootstrap, table_topic, format="upsert-json", schema=TABLE, name="dims",
                                format_options={"key_column": "cust"}, include_metadata=True, stopping_offsets="latest"))  # fmt: skip
    orders = p.source(KafkaSource(apache_kafka.bootstrap, facts_topic, format="json", schema=FACTS, name="facts",
                                  stopping_offsets="latest"))  # fmt: skip
    orders.join_latest(dims, on="cust", how="inner", event_time=("ts", "_timestamp")).sink(
        TwoPhaseCommitTestSink(str(tmp_path / "out"))
    )
    assert p.run(runtime="local", restore="none").status == "finished"
    out = read_committed(str(tmp_path / "out"))
    assert out is not None
    rows: dict[str, Any] = out.to_pydict()
    got = sorted(zip(rows["n"], rows["tier"], rows["_offset"], strict=True))
    assert apache_kafka.read_committed(table_topic) == survivors, "the topic changed while the job read it"
    want = _reference(survivors, facts)
    assert got == want
    tiers = {t for _, t, _ in want}
    assert {"v1-15", "v2-3", "v3-0", "v3-20"} <= tiers and not any(t.startswith("v1-") and int(t[3:]) < 10 for t in tiers)
