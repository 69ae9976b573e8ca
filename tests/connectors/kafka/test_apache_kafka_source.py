"""The Kafka source on a real Apache Kafka (tests/apache_kafka.py), on both readers: what tansu cannot show
(it hands aborted transactions to read_committed consumers, see tests/broker_quirks)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from sluice.config import NoRestart
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


def test_records_deleted_under_the_position_fail_or_are_skipped_as_asked(
    apache_kafka: ApacheKafkaBroker, kafka_topic: Callable[..., str], tmp_path: Path
) -> None:
    """The partition's start moves past the position (``DeleteRecords``): ``fail_on_data_loss`` names the
    partition and offset; without it the reader resets to the new start, counts it and reads on."""
    t = kafka_topic(1)
    apache_kafka.produce(t, json_values(20), partition=0)
    admin = AdminClient({"bootstrap.servers": apache_kafka.bootstrap})
    (fut,) = admin.delete_records([TopicPartition(t, 0, 8)]).values()
    fut.result(30)
    start = {(t, 0): 3}  # under the new start (8): out of range
    stop = {(t, 0): 20}
    p = pipeline("loss-fail", tmp_path / "fail", parallelism=1, restart=NoRestart())
    p.source(KafkaSource(apache_kafka.bootstrap, t, format="json", schema=SCHEMA, starting_offsets=start,
                         stopping_offsets=stop)).sink(TwoPhaseCommitTestSink(str(tmp_path / "fail-out")))  # fmt: skip
    with pytest.raises(Exception, match=rf"{t}.*\b0\b.*\b3\b|offset 3"):
        p.run(runtime="local", restore="none")
    p = pipeline("loss-skip", tmp_path / "skip", parallelism=1, restart=NoRestart())
    skip = KafkaSource(
        apache_kafka.bootstrap, t, format="json", schema=SCHEMA, starting_offsets=start, stopping_offsets=stop,
        fail_on_data_loss=False,
    )  # fmt: skip
    p.source(skip).sink(TwoPhaseCommitTestSink(str(tmp_path / "skip-out")))
    result = p.run(runtime="local", restore="none")
    assert committed_ids(read_committed(str(tmp_path / "skip-out"))) == list(range(8, 20))
    assert result.metrics.get("data_loss_resets", 0) >= 1, result.metrics
