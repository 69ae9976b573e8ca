"""CreatePartitions (adding partitions to an existing topic).

Apache Kafka: AdminClient.create_partitions grows the topic; metadata shows the
new partitions within a metadata refresh; existing partitions keep their data.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from confluent_kafka import KafkaException
from confluent_kafka.admin import NewPartitions
from kafka_broker import TansuBroker


def main() -> None:
    with TansuBroker() as b:
        b.create_topic("t", 2)
        b.produce("t", [b"a", b"b", b"c"], partition=1)
        try:
            b.admin.create_partitions([NewPartitions("t", 4)])["t"].result(10)
            print("tansu: create_partitions OK (same as Kafka)")
        except KafkaException as e:
            print("tansu: create_partitions ->", e.args[0].name(), "-", e.args[0].str())
        n = len(b.admin.list_topics("t", timeout=5).topics["t"].partitions)
        print(f"tansu: metadata shows {n} partitions (Kafka: 4)")
        b.add_partitions("t", 4)  # fixture emulation: delete + recreate + replay
        print("fixture add_partitions ->", b.end_offsets("t"), "(existing offsets preserved)")
    print("Workaround (tests): TansuBroker.add_partitions() deletes, re-creates and replays "
          "the topic; consumers see a brief UNKNOWN_TOPIC_OR_PART during the swap.")


if __name__ == "__main__":
    main()
