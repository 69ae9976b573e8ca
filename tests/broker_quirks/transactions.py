"""Idempotent / transactional producer and read_committed isolation.

Apache Kafka: aborted records are filtered out for isolation.level=read_committed
(via AbortedTransactions in the Fetch response); commit/abort markers occupy one
offset each (gaps); reading stops at the LSO while a transaction is open;
ListOffsets(LATEST, read_committed) returns the LSO.
tansu: markers take offsets and reading stops at the LSO, but aborted records are delivered to
read_committed consumers and ListOffsets(read_committed) answers wrongly while a transaction is open.
"""

from __future__ import annotations

import time

from _broker import NAMES, broker, parse
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition


def read_all(bootstrap: str, iso: str) -> tuple[list[tuple[int, str]], int, tuple[int, int]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "g", "isolation.level": iso,
                  "enable.partition.eof": True, "log_level": 0})
    wm = c.get_watermark_offsets(TopicPartition("t", 0), timeout=5)
    c.assign([TopicPartition("t", 0, 0)])
    out: list[tuple[int, str]] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error() and m.error().code() == KafkaError._PARTITION_EOF:
            c.close()
            return out, m.offset(), wm
        out.append((m.offset(), m.value().decode()))
    raise RuntimeError("no EOF")


def main(kind: str) -> None:
    name = NAMES[kind]
    with broker(kind) as b:
        b.create_topic("t", 1)
        p = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "tx", "log_level": 0})
        p.init_transactions(30)
        print(f"{name}: init_transactions OK (InitProducerId/EndTxn supported)")
        for kind_, n in (("commit", 3), ("abort", 3), ("commit", 2)):
            p.begin_transaction()
            for i in range(n):
                p.produce("t", f"{kind_}-{i}".encode(), partition=0)
            p.flush(10)
            p.commit_transaction(10) if kind_ == "commit" else p.abort_transaction(10)
        p.begin_transaction()
        p.produce("t", b"open-0", partition=0)
        p.flush(10)
        for iso in ("read_committed", "read_uncommitted"):
            recs, eof, wm = read_all(b.bootstrap, iso)
            print(f"{name} {iso}: {recs}\n    EOF at {eof}; ListOffsets watermarks {wm}")
        print("Kafka read_committed (expected): [(0..2 commit-*), (8, commit-0), (9, commit-1)], EOF at 11 (LSO),"
              " ListOffsets high=11")
        p.commit_transaction(10)
        ip = Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True, "log_level": 0})
        errs: list[object] = []
        for _ in range(5):
            ip.produce("t", b"idem", partition=0, on_delivery=lambda e, m: errs.append(e))
        ip.flush(10)
        print(f"{name}: idempotent producer delivery errors:", [e for e in errs if e], "(none = OK)")
    print("Workaround (tests, tansu): never rely on read_committed filtering there; use committed-only")
    print("input data, and expect offset gaps from markers. Abort filtering is tested on Apache Kafka.")


if __name__ == "__main__":
    main(parse(__doc__).broker)
