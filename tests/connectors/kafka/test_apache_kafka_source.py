"""The Kafka source on a real Apache Kafka (tests/apache_kafka.py), on both readers: what tansu cannot show
(it hands aborted transactions to read_committed consumers, see tests/broker_quirks)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Producer
from sluice.connectors.kafka import KafkaSource
from sluice.sinks.testing import TwoPhaseCommitTestSink, read_committed

from tests.apache_kafka import ApacheKafkaBroker
from tests.connectors.kafka.helpers import committed_ids, json_values
from tests.connectors.kafka.test_kafka_e2e import SCHEMA, pipeline

pytestmark = [pytest.mark.kafka, pytest.mark.usefixtures("kafka_reader")]  # on both readers


def test_aborted_transactions_are_skipped_and_a_stop_on_a_marker_ends_the_run(
    apache_kafka: ApacheKafkaBroker, kafka_topic: Callable[..., str], tmp_path: Path
) -> None:
    t = kafka_topic(2)
    tx = Producer({"bootstrap.servers": apache_kafka.bootstrap, "transactional.id": f"tx-{t}", "log_level": 0})
    tx.init_transactions(30)
    expected: list[int] = []
    start = 0
    for n, commit in ((5, True), (3, False), (4, True), (2, False), (6, True)):
        tx.begin_transaction()
        for i, v in enumerate(json_values(n, start)):
            tx.produce(t, v, partition=i % 2)
        if commit:
            tx.commit_transaction(30)
            expected.extend(range(start, start + n))
        else:
            tx.abort_transaction(30)
        start += n
    ends = apache_kafka.end_offsets(t)  # each partition ends with a commit marker: never delivered
    p = pipeline("txn-apache", tmp_path, parallelism=2)
    p.source(
        KafkaSource(
            apache_kafka.bootstrap, t, format="json", schema=SCHEMA, batch_size=3,
            stopping_offsets={(t, q): off for q, off in ends.items()},
        )
    ).sink(TwoPhaseCommitTestSink(str(tmp_path / "out")))  # fmt: skip
    p.run(runtime="local", restore="none")
    assert committed_ids(read_committed(str(tmp_path / "out"))) == expected
