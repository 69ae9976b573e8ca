"""ListOffsets by timestamp (Consumer.offsets_for_times).

Apache Kafka: returns the earliest offset whose record *timestamp* (CreateTime as
sent by the producer) is >= the query, record-exact; -1 (end) if none; -1 on an
empty partition.
tansu: looks up by broker *ingestion* time of each record batch, ignoring the
producer-supplied CreateTime, and answers 0 (not -1/end) when nothing matches.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from confluent_kafka import Consumer, Producer, TopicPartition
from kafka_broker import TansuBroker


def main() -> None:
    with TansuBroker() as b:
        b.create_topic("t", 2)
        p = Producer({"bootstrap.servers": b.bootstrap, "log_level": 0})
        old = int(time.time() * 1000) - 3_600_000  # CreateTime one hour ago
        wall: list[int] = []
        for i in range(4):  # 4 batches of 2 records, CreateTime old+i min, sent 0.3s apart
            wall.append(int(time.time() * 1000))
            p.produce("t", b"v", partition=0, timestamp=old + i * 60_000)
            p.produce("t", b"v", partition=0, timestamp=old + i * 60_000 + 1)
            p.flush(10)
            time.sleep(0.3)
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "g", "log_level": 0})

        def q(ts: int, part: int = 0) -> int:
            return c.offsets_for_times([TopicPartition("t", part, ts)], timeout=5)[0].offset

        for i in range(4):
            print(f"CreateTime query old+{i}min: Kafka {2 * i}, tansu {q(old + i * 60_000)}")
        print(f"CreateTime query old+1min+1ms: Kafka 3, tansu {q(old + 60_001)}")
        for i, ts in enumerate(wall):
            print(f"ingestion wall-clock query #{i}: tansu {q(ts)} (Kafka -1: no CreateTime >= ts)")
        future = int(time.time() * 1000) + 60_000
        print(f"timestamp after all records: Kafka -1 (end), tansu {q(future)}")
        print(f"empty partition: Kafka -1, tansu {q(old, part=1)}")
        c.close()
    print("Workaround (tests): only test timestamp start positions with records produced "
          "without explicit timestamps, at distinct wall-clock times, and never the 'after end' case.")


if __name__ == "__main__":
    main()
