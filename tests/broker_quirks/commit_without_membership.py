"""OffsetCommit / OffsetFetch with manual assign() (no subscribe / group membership).

Apache Kafka: a "simple" consumer (generation -1, no member id) may commit and
fetch offsets for its group.id; commit metadata strings round-trip.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from kafka_broker import TansuBroker


def main() -> None:
    with TansuBroker() as b:
        b.create_topic("t", 2)
        b.produce("t", [b"x"] * 10, partition=0)
        conf = {"bootstrap.servers": b.bootstrap, "group.id": "sluice", "enable.auto.commit": False,
                "log_level": 0}
        c = Consumer(conf)
        c.assign([TopicPartition("t", 0, 0)])
        c.commit(offsets=[TopicPartition("t", 0, 7, metadata="sluice:v1")], asynchronous=False)
        c.close()
        c2 = Consumer(conf)
        got = c2.committed([TopicPartition("t", 0), TopicPartition("t", 1)], timeout=5)
        print("tansu: committed() from a fresh consumer ->",
              [(tp.partition, tp.offset, tp.metadata) for tp in got])
        print("Kafka:                                     [(0, 7, 'sluice:v1'), (1, -1001, None)]")
        res = b.admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("sluice")])
        tps = next(iter(res.values())).result().topic_partitions
        print("tansu: admin list_consumer_group_offsets ->",
              [(t.partition, t.offset, t.metadata) for t in tps])
        try:
            c2.commit(offsets=[TopicPartition("missing", 0, 1)], asynchronous=False)
            print("tansu: commit for unknown topic accepted")
        except KafkaException as e:
            print("tansu: commit for unknown topic ->", e.args[0].name(), "(Kafka: same)")
        c2.close()
    print("Result: commit/fetch without membership works; commit *metadata* is dropped (returns None).")
    print("Workaround (tests): don't assert on commit metadata; keep state in offsets/own files.")


if __name__ == "__main__":
    main()
