"""Record size limit (message.max.bytes).

Apache Kafka: the broker refuses a record batch larger than message.max.bytes (default 1048588, 1 MiB
plus the batch overhead) with MESSAGE_TOO_LARGE; topics can lower or raise it (max.message.bytes).
tansu: no limit is enforced; a 50 MB record is stored and fetched back.
(The producer's own message.max.bytes, 1000000 in librdkafka, is raised here so the broker decides.)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from confluent_kafka import Consumer, Producer, TopicPartition
from kafka_broker import TansuBroker


def main() -> None:
    sizes = [1_048_576, 2_000_000, 50_000_000]
    with TansuBroker() as b:
        b.create_topic("t", 1)
        p = Producer({"bootstrap.servers": b.bootstrap, "message.max.bytes": 100_000_000, "log_level": 0})
        for n in sizes:
            errors: list[object] = []
            p.produce("t", b"x" * n, partition=0, on_delivery=lambda e, _m: errors.append(e))
            p.flush(60)
            print(f"produce {n:>10,} bytes: Kafka MESSAGE_TOO_LARGE, tansu {errors[0] or 'stored'}")
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "g", "log_level": 0})
        c.assign([TopicPartition("t", 0, 0)])
        got: list[int] = []
        while len(got) < len(sizes):
            m = c.poll(10)
            if m is not None and m.error() is None:
                got.append(len(m.value() or b""))
        c.close()
        print(f"fetched back: {got}")
    print("Impact: the broker does not bound record sizes; sluice's max_record_bytes (1 MiB) does, so")
    print("tests of over-limit records produce them to tansu and expect bad records, as Kafka would refuse them.")


if __name__ == "__main__":
    main()
