"""Record headers, keys and timestamps round-trip.

Apache Kafka: headers (incl. duplicates and null values), null/empty keys and
values, and producer CreateTime come back unchanged with timestamp type CREATE_TIME.
"""

from __future__ import annotations

from _broker import NAMES, broker, parse
from confluent_kafka import TIMESTAMP_CREATE_TIME, Consumer, Producer, TopicPartition

SENT = [
    dict(key=b"k1", value=b"v1", timestamp=1_600_000_000_123,
         headers=[("h", b"1"), ("h", b"dup"), ("n", None)]),
    dict(key=None, value=None, timestamp=1_700_000_000_000, headers=[("utf8-é", b"\x00\xff")]),
    dict(key=b"", value=b"", timestamp=1_000, headers=None),
]


def main(kind: str) -> None:
    with broker(kind) as b:
        b.create_topic("t", 1)
        p = Producer({"bootstrap.servers": b.bootstrap, "log_level": 0})
        for rec in SENT:
            p.produce("t", partition=0, **rec)
        p.flush(10)
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "g", "log_level": 0})
        c.assign([TopicPartition("t", 0, 0)])
        got = c.consume(len(SENT), 10)
        ok = True
        for rec, m in zip(SENT, got, strict=True):
            same = (m.key(), m.value(), m.timestamp(), m.headers()) == (
                rec["key"], rec["value"], (TIMESTAMP_CREATE_TIME, rec["timestamp"]), rec["headers"])
            ok &= same
            print(f"offset {m.offset()}: key={m.key()!r} value={m.value()!r} ts={m.timestamp()} "
                  f"headers={m.headers()} -> {'same as sent' if same else 'DIFFERS'}")
        c.close()
    print(f"{NAMES[kind]}:", "round-trip identical to what was sent (Kafka's behaviour)" if ok else "DEVIATES")


if __name__ == "__main__":
    main(parse(__doc__).broker)
