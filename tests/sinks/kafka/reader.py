"""Reading a topic on tansu for the Kafka sink's format tests: every record the broker holds.

Only for tests in which no transaction is ever aborted and which read a finished job: a read_uncommitted
reader then sees what a read_committed one would, and tansu's quirks (records of aborted transactions
delivered to read_committed consumers, tests/broker_quirks/transactions.py; a last stable offset that lags)
do not matter. Whether the sink is exactly once is judged on Apache Kafka by the plain ``read_committed``
reader of tests/kafka_test_broker.py, never here.
"""

from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from tests.kafka_test_broker import KafkaTestBroker, Record

__all__ = ["Record", "read_topic"]


def read_topic(broker: KafkaTestBroker, topic: str, timeout: float = 60.0) -> list[Record]:
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
                part, offset = m.partition(), m.offset()
                assert part is not None and offset is not None
                out.append(Record(part, offset, m.key(), m.value(), tuple(m.headers() or ()), m.timestamp()[1]))
        assert not todo, f"timed out reading {topic} partitions {sorted(todo)}"
    finally:
        c.close()
    return sorted(out, key=lambda r: (r.partition, r.offset))
