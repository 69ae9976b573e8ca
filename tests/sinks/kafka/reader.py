"""Reading what a KafkaSink committed, in a way that holds on the test broker.

tansu is not a faithful reader of transactions (tests/broker_quirks/transactions.py,
concurrent_transactions.py): it delivers the records of aborted transactions to ``read_committed`` consumers,
and when several transactional producers commit at once it sometimes leaves an acknowledged commit half done
(the committed offsets it carried are never applied; ``ListOffsets`` with read_committed answers 0 from then
on). So this reader reads every record the broker holds (read_uncommitted, up to each partition's end as
fetches report it) and decides itself, with the sink's ``lineage_header``: every record carries
``<transactional id>:<checkpoint>:<token>``, a token per transaction attempt. A later attempt publishes a
checkpoint again only after fencing the earlier one, and deterministic partitioning puts every copy's records
in the same partitions, so in each partition **the last copy of a (transactional id, checkpoint) is the only
one that can be committed**. Whether it is:

* ``finished=True`` (the job finished: every checkpoint it took was published): yes;
* ``finished=False`` (read in the middle of a run): if the transactional id's marker reached the checkpoint, or
  a copy of a later checkpoint of the id exists (the id publishes its checkpoints in order).

On Apache Kafka the same rule gives what a read_committed consumer gets.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from tests.kafka_broker import TansuBroker

HEADER = "sluice-lineage"


@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int

    def header(self, name: str) -> bytes | None:
        return next((v for k, v in self.headers if k == name), None)


def read_topic(broker: TansuBroker, topic: str, timeout: float = 60.0) -> list[Record]:
    """Every record of ``topic`` the broker holds (read_uncommitted), in partition and offset order."""
    parts = broker.admin.list_topics(topic=topic, timeout=timeout).topics[topic].partitions
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "sluice-test-reader", "enable.auto.commit": False,
                  "isolation.level": "read_uncommitted", "enable.partition.eof": True, "fetch.wait.max.ms": 10,
                  "log_level": 0})  # fmt: skip
    todo = set(parts)
    out: list[Record] = []
    try:
        c.assign([TopicPartition(topic, p, 0) for p in todo])
        deadline = time.monotonic() + timeout
        while todo and time.monotonic() < deadline:
            for m in c.consume(10000, 0.2):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        todo.discard(m.partition())
                        continue
                    raise KafkaException(err)
                ts = m.timestamp()[1]
                out.append(Record(m.partition(), m.offset(), m.key(), m.value(), tuple(m.headers() or ()), ts))
        assert not todo, f"timed out reading {topic} partitions {sorted(todo)}"
    finally:
        c.close()
    return sorted(out, key=lambda r: (r.partition, r.offset))


def markers(broker: TansuBroker, groups: set[str], marker_topic: str) -> dict[str, int]:
    """The committed marker offset (a checkpoint id) of each group; -1 if none."""
    out = {}
    for g in groups:
        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": g, "isolation.level": "read_uncommitted",
                      "log_level": 0})  # fmt: skip
        try:
            (tp,) = c.committed([TopicPartition(marker_topic, 0)], timeout=30)
            out[g] = int(tp.offset)
        finally:
            c.close()
    return out


@dataclass
class Committed:
    """What the sink committed to a topic, read per the module docstring."""

    records: list[Record]
    #: records of aborted (or never committed) transactions that the broker delivered anyway
    aborted: list[Record] = field(default_factory=list)

    def values(self) -> list[Any]:
        return [json.loads(r.value) for r in self.records if r.value is not None]

    def table(self) -> pa.Table | None:
        rows = self.values()
        return pa.Table.from_pylist(rows) if rows else None


def read_committed(
    broker: TansuBroker, topic: str, finished: bool = False, marker_topic: str | None = None, header: str = HEADER
) -> Committed:
    """The records the sink committed (see the module docstring); every record must carry ``header``."""
    records = read_topic(broker, topic)
    tags: dict[Record, tuple[str, int, str]] = {}
    for r in records:
        raw = r.header(header)
        assert raw is not None, f"record {r.partition}/{r.offset} of {topic} has no {header} header"
        txn, ckpt, token = raw.decode().rsplit(":", 2)
        tags[r] = (txn, int(ckpt), token)
    last: dict[tuple[int, str, int], str] = {}
    newest: dict[str, int] = {}
    for r in records:  # offset order: the last token wins
        txn, ckpt, token = tags[r]
        last[(r.partition, txn, ckpt)] = token
        newest[txn] = max(newest.get(txn, 0), ckpt)
    done = {} if finished else markers(broker, set(newest), marker_topic or topic)
    out = Committed([])
    for r in records:
        txn, ckpt, token = tags[r]
        published = finished or ckpt <= done[txn] or ckpt < newest[txn]
        (out.records if published and last[(r.partition, txn, ckpt)] == token else out.aborted).append(r)
    return out


def counts(values: list[Any], columns: list[str]) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(v[c] for c in columns) for v in values)
