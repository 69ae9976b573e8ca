"""Fetching from an offset beyond the high watermark (stale checkpoint / truncated topic).

Apache Kafka: Fetch returns OFFSET_OUT_OF_RANGE; librdkafka then applies
auto.offset.reset: 'error' -> consumer error _AUTO_OFFSET_RESET, 'earliest' ->
restart at the low watermark, 'latest' -> jump to the high watermark.
tansu: Fetch returns no error and no data; the consumer waits silently at the
requested offset and, once the log grows past it, resumes there (records in
between are skipped). Also: DeleteRecords (to move the low watermark) drops the
connection, so "offset below log start" cannot be produced on tansu at all.
"""

from __future__ import annotations

import time

from _broker import NAMES, broker, parse
from confluent_kafka import Consumer, KafkaException, TopicPartition

KAFKA = {"error": "[_AUTO_OFFSET_RESET error]", "earliest": "[0, 1, 2, 3, 4]", "latest": "[] (at 5)"}


def main(kind: str) -> None:
    name = NAMES[kind]
    with broker(kind) as b:
        for reset in ("error", "earliest", "latest"):
            t = f"t-{reset}"
            b.create_topic(t, 1)
            b.produce(t, [b"x"] * 5, partition=0)
            c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "g", "log_level": 0,
                          "auto.offset.reset": reset, "fetch.wait.max.ms": 100})
            c.assign([TopicPartition(t, 0, 100)])  # high watermark is 5
            seen: list[object] = []
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline:
                m = c.poll(0.2)
                if m is not None:
                    seen.append(m.error().name() if m.error() else m.offset())
            print(f"auto.offset.reset={reset:8s} seek 100: Kafka {KAFKA[reset]:28s} {name} {seen} "
                  f"(position {c.position([TopicPartition(t, 0)])[0].offset})")
            if reset == "error":
                b.produce(t, [b"y"] * 100, partition=0)  # log grows to 105
                later = [m.offset() if m.error() is None else m.error().name() for m in c.consume(100, 3)]
                print(f"  after producing offsets 5..104: consumer gets {later[:1]} "
                      f"({len(later)} messages; tansu: resumes at 100, 5..99 silently skipped)")
            c.close()
        try:
            tp = TopicPartition("t-latest", 0, 2)
            low = b.admin.delete_records([tp])[tp].result(10).low_watermark
            print(f"{name}: delete_records OK, low watermark now {low} (Kafka: 2)")
        except KafkaException as e:
            print(f"{name}: delete_records ->", e.args[0].name(), "(Kafka: low watermark moves to 2)")
    print("Workaround (tests, tansu): OFFSET_OUT_OF_RANGE / auto.offset.reset handling cannot be tested on")
    print("tansu; on Apache Kafka it is (tests/connectors/kafka/test_apache_kafka_source.py).")


if __name__ == "__main__":
    main(parse(__doc__).broker)
