"""CreateTopics / DeleteTopics / DescribeConfigs / auto-create via AdminClient.

Apache Kafka: create works; duplicate -> TOPIC_ALREADY_EXISTS; DescribeConfigs
returns the full topic config (cleanup.policy, retention.ms, ...); producing to
an unknown topic auto-creates it (auto.create.topics.enable=true by default).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from confluent_kafka import Producer
from confluent_kafka.admin import ConfigResource, NewTopic
from kafka_broker import TansuBroker


def main() -> None:
    with TansuBroker() as b:
        b.admin.create_topics([NewTopic("t", 3, 1)])["t"].result(10)
        n = len(b.admin.list_topics("t", timeout=5).topics["t"].partitions)
        print(f"tansu: create_topics('t', 3) -> {n} partitions")
        try:
            b.admin.create_topics([NewTopic("t", 3, 1)])["t"].result(10)
            print("tansu: duplicate create succeeded (Kafka: TOPIC_ALREADY_EXISTS)")
        except Exception as e:
            print("tansu: duplicate create ->", e.args[0].name(), "(same as Kafka)")
        cfg = b.admin.describe_configs([ConfigResource("topic", "t")])
        entries = next(iter(cfg.values())).result(10)
        print(f"tansu: describe_configs(topic t) -> {len(entries)} entries "
              "(Kafka: ~30 entries incl. retention.ms, cleanup.policy)")
        b.admin.delete_topics(["t"])["t"].result(10)
        listed = "t" in b.admin.list_topics(timeout=5).topics
        print("tansu: delete_topics ok; topic listed afterwards:", listed)
        p = Producer({"bootstrap.servers": b.bootstrap, "message.timeout.ms": 3000, "log_level": 0})
        errs: list[str] = []
        p.produce("never-created", b"x", on_delivery=lambda e, m: errs.append(str(e.name() if e else "ok")))
        p.flush(10)
        print("tansu: produce to unknown topic ->", errs, "; topic exists now:",
              "never-created" in b.admin.list_topics(timeout=5).topics,
              "(Kafka default: auto-created, delivery ok)")
    print("Workaround (tests): always create topics explicitly; don't rely on topic configs.")


if __name__ == "__main__":
    main()
