"""High watermark from ListOffsets (get_watermark_offsets / list_offsets LATEST).

Apache Kafka: high watermark = offset of the last record + 1.
tansu: ListOffsets(LATEST) returns base offset of the *last record batch* + 1, so
it under-reports whenever the last produce batch held more than one record.
The HighWatermark in Fetch responses is correct (cached watermarks, PARTITION_EOF).
"""

from __future__ import annotations

from _broker import NAMES, broker, parse
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import OffsetSpec


def main(kind: str) -> None:
    name = NAMES[kind]
    with broker(kind) as b:
        b.create_topic("t", 1)
        tp = TopicPartition("t", 0)
        p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 50, "log_level": 0})
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "g", "log_level": 0,
                      "enable.partition.eof": True})
        total = 0
        for batch in (10, 1, 5):
            for _ in range(batch):
                p.produce("t", b"v", partition=0)
            p.flush(10)
            total += batch
            lo, hi = c.get_watermark_offsets(tp, timeout=5)
            print(f"after a {batch:2d}-record batch: Kafka high={total}  {name} high={hi} (low={lo})")
        r = b.admin.list_offsets({tp: OffsetSpec.latest()})[tp].result(10)
        print(f"admin list_offsets(LATEST): Kafka {total}, {name} {r.offset}")
        c.assign([TopicPartition("t", 0, 0)])
        eof = None
        while eof is None:
            m = c.poll(5)
            if m is not None and m.error() and m.error().code() == KafkaError._PARTITION_EOF:
                eof = m.offset()
        print(f"Fetch-based: PARTITION_EOF at {eof}, cached watermarks "
              f"{c.get_watermark_offsets(tp, cached=True)}")
        print(f"{type(b).__name__}.end_offsets() ->", b.end_offsets("t"))
        c.close()
    print("Impact on tansu: 'caught up' checks / lag / \"latest\" based on ListOffsets are wrong there.")
    print("Workaround (tests, tansu only): TansuBroker.end_offsets() reads the last batch and uses PARTITION_EOF.")


if __name__ == "__main__":
    main(parse(__doc__).broker)
