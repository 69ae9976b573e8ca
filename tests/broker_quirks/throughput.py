"""Producer + single-consumer fetch throughput (tansu: memory storage; --broker apache: Apache Kafka).

Apache Kafka (local, 1 broker): a single librdkafka consumer reads several
hundred thousand to ~1M small msgs/s; fetch sizes are capped by
max.partition.fetch.bytes (1 MiB default).
tansu: comparable speed (not a bottleneck); it ignores max.partition.fetch.bytes
(returns whole partitions per fetch), so the client-side queue limits
(queued.max.messages.kbytes / queued.min.messages) decide throughput.
Env: N (default 500000), PARTITIONS (default 4), REPEATS (default 3). Numbers vary +-40% on 2 cores.
"""

from __future__ import annotations

import os
import time

from _broker import NAMES, broker, parse
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

N = int(os.environ.get("N", "500000"))
PARTS = int(os.environ.get("PARTITIONS", "4"))
REPEATS = int(os.environ.get("REPEATS", "3"))
VALUE = (b'{"id": 1234567, "ts": "2024-01-01T00:00:00Z", "user": "user-000042", '
         b'"event": "click", "payload": "xxxxxxxxxxxxxxxxxxxxxxxxx"}').ljust(140, b" ")

CONSUMER_PROFILES: dict[str, dict[str, object]] = {
    "default": {},
    "tuned": {
        "fetch.max.bytes": 64 * 1024 * 1024,
        "max.partition.fetch.bytes": 16 * 1024 * 1024,
        "queued.max.messages.kbytes": 256 * 1024,
        "queued.min.messages": 1_000_000,
        "fetch.wait.max.ms": 100,
    },
    "small-fetch": {"max.partition.fetch.bytes": 256 * 1024, "fetch.max.bytes": 1024 * 1024},
}


def produce(bootstrap: str, topic: str, batch: int) -> float:
    p = Producer({
        "bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": batch,
        "batch.size": 1_000_000, "queue.buffering.max.messages": 2_000_000,
        "queue.buffering.max.kbytes": 2_097_151, "log_level": 0,
    })
    t0 = time.perf_counter()
    for i in range(N):
        while True:
            try:
                p.produce(topic, VALUE, partition=i % PARTS)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(120) == 0
    return N / (time.perf_counter() - t0)


def consume(bootstrap: str, topic: str, extra: dict[str, object]) -> tuple[float, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "tp", "enable.auto.commit": False,
                  "enable.partition.eof": True, "log_level": 0, **extra})
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTS)])
    got, eof = 0, set()
    t0 = time.perf_counter()
    # short consume() timeout: a long one would be billed to the last batch
    while len(eof) < PARTS and time.perf_counter() - t0 < 300:
        for m in c.consume(10000, 0.05):
            if m.error() is None:
                got += 1
            elif m.error().code() == KafkaError._PARTITION_EOF:
                eof.add(m.partition())
    dt = time.perf_counter() - t0
    c.close()
    return got / dt, got


def main(kind: str) -> None:
    print(f"{NAMES[kind]}:")
    with broker(kind) as b:
        for batch in (10000, 100):
            topic = f"tp{batch}"
            b.create_topic(topic, PARTS)
            rate = produce(b.bootstrap, topic, batch)
            print(f"producer batch.num.messages={batch}: {N} x {len(VALUE)}B over {PARTS} "
                  f"partitions -> {rate:,.0f} msgs/s")
            for name, cfg in CONSUMER_PROFILES.items():
                runs = [consume(b.bootstrap, topic, cfg) for _ in range(REPEATS)]
                rates = ", ".join(f"{r:,.0f}" for r, _ in runs)
                print(f"  consumer [{name:11s}] {runs[0][1]} msgs -> best {max(runs)[0]:,.0f} msgs/s "
                      f"(runs: {rates})  {cfg}")
    print("Recommended consumer settings: the 'tuned' profile (~2x default on this machine).")


if __name__ == "__main__":
    main(parse(__doc__).broker)
