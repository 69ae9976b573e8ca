"""Demo event producer: creates the topic, then produces JSON events to it.

Environment:
    KAFKA_BOOTSTRAP_SERVERS  default kafka:9092
    SLUICE_TOPIC             default events
    TOPIC_PARTITIONS         default 4 (one split per partition; match the job's parallelism)
    EVENTS_PER_SECOND        default 200
    MAX_EVENTS               default 0 = produce forever; otherwise stop after that many and stay idle
    READY_FILE               default /tmp/topic-ready: written once the topic exists (compose healthcheck)

Events are deterministic per ``event_id`` so a run can be checked against its output::

    {"event_id": 42, "user_id": "user-0042", "kind": "click", "amount": 4.2, "ts": 1700000000000}
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

KINDS = ("view", "click", "cart", "purchase")


def event(i: int, now_ms: int) -> dict[str, Any]:
    return {
        "event_id": i,
        "user_id": f"user-{i % 1000:04d}",
        "kind": KINDS[i % len(KINDS)],
        "amount": round((i % 500) / 10, 2),
        "ts": now_ms,
    }


def ensure_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    try:
        futures[topic].result(timeout=30)
        print(f"created topic {topic!r} with {partitions} partitions", flush=True)
    except KafkaException as exc:
        if "TOPIC_ALREADY_EXISTS" not in str(exc.args[0]):
            raise
        print(f"topic {topic!r} exists", flush=True)


def main() -> int:
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "kafka:9092")
    topic = os.environ.get("SLUICE_TOPIC", "events")
    partitions = int(os.environ.get("TOPIC_PARTITIONS", "4"))
    rate = float(os.environ.get("EVENTS_PER_SECOND", "200"))
    max_events = int(os.environ.get("MAX_EVENTS", "0"))
    ready = Path(os.environ.get("READY_FILE", "/tmp/topic-ready"))

    ensure_topic(bootstrap, topic, partitions)
    ready.write_text(topic)

    stop = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20})
    i, started = 0, time.monotonic()
    while not stop and (max_events == 0 or i < max_events):
        e = event(i, int(time.time() * 1000))
        producer.produce(topic, key=e["user_id"].encode(), value=json.dumps(e).encode())
        producer.poll(0)
        i += 1
        if i % 1000 == 0:
            print(f"produced {i} events", flush=True)
        ahead = i / rate - (time.monotonic() - started)
        if ahead > 0:
            time.sleep(ahead)
    producer.flush(30)
    print(f"produced {i} events in total", flush=True)
    while not stop:  # stay up (and healthy) until compose stops the service
        time.sleep(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
