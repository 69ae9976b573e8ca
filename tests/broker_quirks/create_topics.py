"""CreateTopics / DeleteTopics / DescribeConfigs / auto-create via AdminClient.

Apache Kafka: create works; duplicate -> TOPIC_ALREADY_EXISTS; DescribeConfigs
returns the full topic config (cleanup.policy, retention.ms, ...); producing to
an unknown topic auto-creates it (auto.create.topics.enable=true by default).
tansu: the same, except that DescribeConfigs returns 0 entries.
"""

from __future__ import annotations

from _broker import NAMES, broker, parse
from confluent_kafka import Producer
from confluent_kafka.admin import ConfigResource, NewTopic


def main(kind: str) -> None:
    name = NAMES[kind]
    with broker(kind) as b:
        b.admin.create_topics([NewTopic("t", 3, 1)])["t"].result(10)
        b._wait_partitions("t", 3, 10)
        n = len(b.admin.list_topics("t", timeout=5).topics["t"].partitions)
        print(f"{name}: create_topics('t', 3) -> {n} partitions")
        try:
            b.admin.create_topics([NewTopic("t", 3, 1)])["t"].result(10)
            print(f"{name}: duplicate create succeeded (Kafka: TOPIC_ALREADY_EXISTS)")
        except Exception as e:
            print(f"{name}: duplicate create ->", e.args[0].name())
        cfg = b.admin.describe_configs([ConfigResource("topic", "t")])
        entries = next(iter(cfg.values())).result(10)
        print(f"{name}: describe_configs(topic t) -> {len(entries)} entries"
              + (f", retention.ms={entries['retention.ms'].value}" if "retention.ms" in entries else ""))
        b.admin.delete_topics(["t"])["t"].result(10)
        listed = "t" in b.admin.list_topics(timeout=5).topics
        print(f"{name}: delete_topics ok; topic listed afterwards:", listed)
        p = Producer({"bootstrap.servers": b.bootstrap, "message.timeout.ms": 10000, "log_level": 0})
        errs: list[str] = []
        p.produce("never-created", b"x", on_delivery=lambda e, m: errs.append(str(e.name() if e else "ok")))
        p.flush(15)
        print(f"{name}: produce to unknown topic ->", errs, "; topic exists now:",
              "never-created" in b.admin.list_topics(timeout=5).topics)
    print("Kafka (expected): TOPIC_ALREADY_EXISTS, ~30 config entries incl. retention.ms, auto-create -> ['ok'].")
    print("Workaround (tests, tansu): always create topics explicitly; don't rely on topic configs.")


if __name__ == "__main__":
    main(parse(__doc__).broker)
