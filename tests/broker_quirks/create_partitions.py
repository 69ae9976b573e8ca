"""CreatePartitions (adding partitions to an existing topic).

Apache Kafka: AdminClient.create_partitions grows the topic; metadata shows the
new partitions within a metadata refresh; existing partitions keep their data.
tansu: not implemented (_UNSUPPORTED_FEATURE); TansuBroker.add_partitions emulates it.
"""

from __future__ import annotations

from _broker import NAMES, broker, parse
from confluent_kafka import KafkaException
from confluent_kafka.admin import NewPartitions


def main(kind: str) -> None:
    name = NAMES[kind]
    with broker(kind) as b:
        b.create_topic("t", 2)
        b.produce("t", [b"a", b"b", b"c"], partition=1)
        try:
            b.admin.create_partitions([NewPartitions("t", 4)])["t"].result(10)
            print(f"{name}: create_partitions OK")
        except KafkaException as e:
            print(f"{name}: create_partitions ->", e.args[0].name(), "-", e.args[0].str())
        b._wait_partitions("t", 2, 10)
        n = len(b.admin.list_topics("t", timeout=5).topics["t"].partitions)
        print(f"{name}: metadata shows {n} partitions (Kafka: 4)")
        if n < 4:
            b.add_partitions("t", 4)  # TansuBroker: delete + recreate + replay
            print("TansuBroker.add_partitions (emulated) ->", b.end_offsets("t"), "(existing offsets preserved)")
        else:
            print(f"{name}: end offsets {b.end_offsets('t')} (existing data kept)")
    print("Workaround (tests, tansu only): TansuBroker.add_partitions() deletes, re-creates and replays "
          "the topic; consumers see a brief UNKNOWN_TOPIC_OR_PART during the swap.")


if __name__ == "__main__":
    main(parse(__doc__).broker)
