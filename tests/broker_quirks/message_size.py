"""Record size limit (message.max.bytes).

Apache Kafka: the broker refuses a record batch larger than message.max.bytes (default 1048588, 1 MiB
plus the batch overhead) with MESSAGE_TOO_LARGE; topics can lower or raise it (max.message.bytes).
tansu: no limit is enforced; a 50 MB record is stored and fetched back.
(The producer's own message.max.bytes, 1000000 in librdkafka, is raised here so the broker decides.)
"""

from __future__ import annotations

import time

from _broker import NAMES, broker, parse
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition


def main(kind: str) -> None:
    name = NAMES[kind]
    sizes = [1_000_000, 1_048_576, 2_000_000, 50_000_000]
    stored = 0
    with broker(kind) as b:
        b.create_topic("t", 1)
        p = Producer({"bootstrap.servers": b.bootstrap, "message.max.bytes": 100_000_000, "log_level": 0})
        for n in sizes:
            errors: list[object] = []
            p.produce("t", b"x" * n, partition=0, on_delivery=lambda e, _m: errors.append(e))
            p.flush(60)
            stored += errors[0] is None
            print(f"produce {n:>10,} bytes: {name} {errors[0].name() if errors[0] else 'stored'}")
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "g", "enable.partition.eof": True,
                      "fetch.max.bytes": 100_000_000, "max.partition.fetch.bytes": 100_000_000,
                      "receive.message.max.bytes": 200_000_000, "log_level": 0})
        c.assign([TopicPartition("t", 0, 0)])
        got: list[int] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            m = c.poll(1)
            if m is None:
                continue
            if m.error() is None:
                got.append(len(m.value() or b""))
            elif m.error().code() == KafkaError._PARTITION_EOF:
                break
        c.close()
        print(f"fetched back: {got}")
    print("Kafka (expected): MESSAGE_TOO_LARGE from 1,048,576 bytes on (a batch over message.max.bytes 1048588).")
    print("sluice's max_record_bytes (1 MiB) bounds what a source decodes; tests of over-limit records produce")
    print("them to tansu, or to an Apache Kafka topic with max.message.bytes raised.")


if __name__ == "__main__":
    main(parse(__doc__).broker)
