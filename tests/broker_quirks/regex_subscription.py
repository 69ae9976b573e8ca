"""Metadata for all topics and regex subscription (subscribe(['^orders\\..*'])).

Apache Kafka: list_topics() lists every topic; a regex subscription gets its first
assignment after group.initial.rebalance.delay.ms (3 s by default; 0 in tests/apache_kafka.py)
and picks up new matching topics on the next metadata refresh.
tansu: list_topics() and regex matching behave the same, but the first JoinGroup
of a new group is held for about session.timeout.ms/2 (~22s with the 45s default).
"""

from __future__ import annotations

import time

from _broker import NAMES, broker, parse
from confluent_kafka import Consumer


def first_assignment(bootstrap: str, group: str, extra: dict[str, object]) -> tuple[float, list[str]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "log_level": 0,
                  "auto.offset.reset": "earliest", "topic.metadata.refresh.interval.ms": 1000, **extra})
    got: list[tuple[float, list[str]]] = []
    t0 = time.monotonic()
    c.subscribe(["^orders\\..*"], on_assign=lambda _c, ps: got.append(
        (time.monotonic() - t0, sorted({f"{p.topic}" for p in ps}))))
    while not got and time.monotonic() - t0 < 40:
        c.poll(0.2)
    c.close()
    return got[0] if got else (float("inf"), [])


def main(kind: str) -> None:
    name = NAMES[kind]
    with broker(kind) as b:
        for t in ("orders.a", "orders.b", "payments"):
            b.create_topic(t, 2)
        print(f"{name}: list_topics ->", sorted(t for t in b.admin.list_topics(timeout=5).topics if not t.startswith("__")))
        for extra in ({"session.timeout.ms": 6000}, {}):
            dt, topics = first_assignment(b.bootstrap, f"g{len(extra)}", extra)
            print(f"{name}: regex subscribe {extra or '(defaults: session.timeout.ms=45000)'}: "
                  f"first assignment {topics} after {dt:.1f}s (Kafka: group.initial.rebalance.delay.ms)")
    print("Workaround (tests, tansu): set session.timeout.ms=6000 for subscribe()-based consumers.")


if __name__ == "__main__":
    main(parse(__doc__).broker)
