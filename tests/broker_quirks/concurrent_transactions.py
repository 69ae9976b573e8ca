"""Transactional producers committing at the same time.

Apache Kafka: a transaction whose commit_transaction() returned is complete: its records are below the last
stable offset and the consumer-group offsets it carried (send_offsets_to_transaction) are committed.

tansu: with three transactional producers committing two transactions each at the same time, now and then
(about 6 trials in 100 here) one acknowledged commit is left half done: the offsets it carried are never
applied, and ListOffsets(LATEST) with read_committed answers 0 for every partition from then on (a
read_committed fetch still returns the records). Nothing repairs it later (waited 70 s). A transaction that
carries only offsets and no records never applies them.
"""

from __future__ import annotations

import threading

from _broker import NAMES, broker, parse
from confluent_kafka import Consumer, Producer, TopicPartition


def main(kind: str, trials: int) -> None:
    stuck = lost = 0
    with broker(kind) as b:
        for trial in range(trials):
            topic = f"t{trial}"
            b.create_topic(topic, 3)

            def run(k: int, topic: str = topic) -> None:
                tid = f"{topic}-{k}"
                c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": tid, "log_level": 0})
                p = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": tid, "log_level": 0})
                p.init_transactions(30)
                for checkpoint in (1, 2):
                    p.begin_transaction()
                    for i in range(60):
                        p.produce(topic, b"v%d" % i, None, (i + k) % 3)
                    p.send_offsets_to_transaction([TopicPartition(topic, 0, checkpoint)], c.consumer_group_metadata(), 10)
                    p.commit_transaction(10)
                c.close()

            threads = [threading.Thread(target=run, args=(k,)) for k in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "w", "isolation.level": "read_committed",
                          "log_level": 0})  # fmt: skip
            stuck += any(c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] == 0 for p in range(3))
            c.close()
            for k in range(3):
                g = Consumer({"bootstrap.servers": b.bootstrap, "group.id": f"{topic}-{k}", "log_level": 0})
                lost += g.committed([TopicPartition(topic, 0)], timeout=30)[0].offset != 2
                g.close()
    print(f"{NAMES[kind]}: {trials} trials of 3 concurrent transactional producers x 2 commits:")
    print(f"  read_committed ListOffsets stuck at 0 after all commits returned: {stuck} trial(s)")
    print(f"  acknowledged commits whose offsets were never applied: {lost}")
    print("Kafka (expected): 0 and 0. Workaround: the KafkaSink's transactional tests run on Apache Kafka; on tansu")
    print("  only finished jobs of one transaction, read with read_uncommitted (tests/sinks/kafka/reader.py).")


if __name__ == "__main__":
    args = parse(__doc__, lambda p: p.add_argument("--trials", type=int, default=100))
    main(args.broker, args.trials)
