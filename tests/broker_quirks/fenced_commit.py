"""A zombie's commit after its transactional id was fenced.

Apache Kafka: when a second producer calls init_transactions() with the same transactional.id, the broker
bumps the producer epoch and aborts the first producer's open transaction; the first producer's
commit_transaction() then fails at once with a fatal PRODUCER_FENCED (or INVALID_PRODUCER_EPOCH) error.

tansu: the zombie's commit_transaction() gets no answer and times out (_TIMED_OUT, "retry call to resume"),
neither fatal nor abortable. Its records are not committed (the fenced transaction stays aborted: the
consumer-group offset it carried does not move) but, as with every abort on tansu (transactions.py), they
are delivered to read_committed consumers.
"""

from __future__ import annotations

import time

from _broker import NAMES, broker, parse
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition


def main(kind: str) -> None:
    name = NAMES[kind]
    with broker(kind) as b:
        b.create_topic("out", 1)
        tid = "fence-me"
        zombie = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": tid, "log_level": 0})
        group = Consumer({"bootstrap.servers": b.bootstrap, "group.id": tid, "log_level": 0})
        zombie.init_transactions(10)
        zombie.begin_transaction()
        for i in range(5):
            zombie.produce("out", b"zombie-%d" % i, None, 0)
        zombie.flush(10)
        zombie.send_offsets_to_transaction([TopicPartition("out", 0, 7)], group.consumer_group_metadata(), 10)
        fresh = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": tid, "log_level": 0})
        fresh.init_transactions(30)  # fences the zombie
        t0 = time.monotonic()
        try:
            zombie.commit_transaction(5)
            outcome = "committed (!)"
        except KafkaException as exc:
            e = exc.args[0]
            outcome = f"{e.name()} (fatal={e.fatal()}, abortable={e.txn_requires_abort()}, retriable={e.retriable()})"
        took = time.monotonic() - t0
        marker = group.committed([TopicPartition("out", 0)], timeout=10)[0].offset
        reader = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "r", "isolation.level": "read_committed",
                           "auto.offset.reset": "earliest", "enable.partition.eof": True, "log_level": 0})  # fmt: skip
        reader.assign([TopicPartition("out", 0, 0)])
        seen = []
        while True:
            m = reader.poll(10)
            if m is None or m.error():
                break
            seen.append(m.value())
        reader.close()
        group.close()
    print(f"{name}: the fenced zombie's commit_transaction(): {outcome} after {took:.1f} s")
    print(f"  the offset its transaction carried: {marker} (-1001 = none: not applied)")
    print(f"  read_committed consumer sees {len(seen)} of its 5 records")
    print("Kafka (expected): PRODUCER_FENCED (fatal) at once; offset not applied; read_committed sees 0 records.")


if __name__ == "__main__":
    main(parse(__doc__).broker)
