"""The Kafka source on Apache Kafka (tests/apache_kafka.py), where the broker's semantics decide: the last
stable offset as ``"latest"``, records of aborted transactions, offsets by timestamp, out-of-range
positions, consumer-group offsets, partitions added to a topic, consumer lag, a broker crash mid-run.

tansu cannot show these (tests/broker_quirks/README.md: its ListOffsets(LATEST) under-reports, it hands
aborted records to read_committed readers, answers 0 for a timestamp after the last record, never says
OFFSET_OUT_OF_RANGE and implements neither DeleteRecords nor CreatePartitions). Every test compares what
the job committed with what it produced, record by record.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from sluice.api import Pipeline
from sluice.config import CheckpointConfig, NoRestart
from sluice.connectors.kafka import KafkaDataLossError, KafkaSource, OffsetsInitializer
from sluice.errors import JobFailedError
from sluice.sinks.testing import TwoPhaseCommitTestSink, read_committed

from tests.apache_kafka import ApacheKafkaBroker
from tests.connectors.kafka.helpers import committed_ids, json_values, produce_json
from tests.connectors.kafka.test_kafka_e2e import SCHEMA, pipeline, slow, wait_for
from tests.faults.shapes import record

# on both readers; the crash test has a broker of its own
pytestmark = [pytest.mark.kafka, pytest.mark.apache_kafka, pytest.mark.usefixtures("kafka_reader")]

Topic = Callable[..., str]


def _transactional(bootstrap: str, txn_id: str) -> Producer:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 5, "log_level": 0})
    p.init_transactions(30)
    return p


def _txn(p: Producer, topic: str, ids: range, commit: bool | None, partitions: int = 2) -> list[int]:
    """One transaction of ``ids`` spread over the partitions: committed, aborted, or (None) left open."""
    p.begin_transaction()
    for i, v in zip(ids, json_values(len(ids), ids.start), strict=True):
        p.produce(topic, v, partition=i % partitions)
    p.flush(30)  # librdkafka can fail an abort racing its own first AddPartitionsToTxn (librdkafka #4849)
    if commit is not None:
        (p.commit_transaction if commit else p.abort_transaction)(30)
    return list(ids) if commit else []


def _run(bootstrap: str, t: str, out: Path, tmp_path: Path, restore: str = "none", **options: object) -> None:
    p = pipeline("ak", tmp_path, parallelism=2)
    p.source(KafkaSource(bootstrap, t, format="json", schema=SCHEMA, batch_size=100, **options)).sink(  # type: ignore[arg-type]
        TwoPhaseCommitTestSink(str(out))
    )
    result = p.run(runtime="local", restore=restore)  # type: ignore[arg-type]
    assert result.status == "finished"


def _out(out: Path) -> list[int]:
    return committed_ids(read_committed(str(out)))


# -- "latest" and transactions ---------------------------------------------------------------------------
def test_latest_stop_is_the_last_stable_offset_and_aborted_records_are_never_read(
    apache_kafka: ApacheKafkaBroker, kafka_topic: Topic, tmp_path: Path
) -> None:
    """``stopping_offsets="latest"`` ends at each partition's last stable offset when the run starts: records
    produced in batches (tansu under-reported those) and a committed transaction are read, an aborted one
    never, an open one not by this run but by the next, once committed."""
    t, out = kafka_topic(2), tmp_path / "out"
    ids = produce_json(apache_kafka, t, {0: range(0, 700), 1: range(1000, 1400)})  # batches of many records
    p = _transactional(apache_kafka.bootstrap, f"{t}-in")
    ids += _txn(p, t, range(5000, 5300), commit=True)
    _txn(p, t, range(6000, 6200), commit=False)
    _txn(p, t, range(7000, 7100), commit=None)  # open while the first run starts and ends
    assert apache_kafka.stable_offsets(t) != apache_kafka.end_offsets(t)
    _run(apache_kafka.bootstrap, t, out, tmp_path, stopping_offsets="latest")
    assert _out(out) == sorted(ids)
    p.commit_transaction(30)
    ids += range(7000, 7100)
    ids += produce_json(apache_kafka, t, {0: range(8000, 8050)})
    _run(apache_kafka.bootstrap, t, out, tmp_path, restore="latest", stopping_offsets="latest")  # reads on
    assert _out(out) == sorted(ids)
    # the independent reader agrees: exactly these records are committed in the topic
    seen = sorted(json.loads(r.value or b"null")["id"] for r in apache_kafka.read_committed(t))
    assert seen == sorted(ids)


def test_an_unbounded_run_reads_committed_transactions_only(
    apache_kafka: ApacheKafkaBroker, kafka_topic: Topic, tmp_path: Path
) -> None:
    """While the job runs, transactions commit and abort (interleaved with plain records): the output is
    the committed records, once each; nothing of the aborted ones."""
    t, out = kafka_topic(2), tmp_path / "out"
    p = _transactional(apache_kafka.bootstrap, f"{t}-in")
    ids = _txn(p, t, range(0, 400), commit=True)
    _txn(p, t, range(10_000, 10_300), commit=False)
    job = pipeline("ak-txn", tmp_path, parallelism=2)
    job.source(KafkaSource(apache_kafka.bootstrap, t, format="json", schema=SCHEMA, batch_size=100)).sink(
        TwoPhaseCommitTestSink(str(out))
    )
    client = job.start(runtime="local", restore="none")
    try:
        wait_for(lambda: len(_out(out)) >= len(ids), client)
        for k in range(3):
            ids += _txn(p, t, range(1000 * (k + 1), 1000 * (k + 1) + 200), commit=True)
            _txn(p, t, range(20_000 + 1000 * k, 20_000 + 1000 * k + 150), commit=False)
            ids += produce_json(apache_kafka, t, {k % 2: range(30_000 + 100 * k, 30_000 + 100 * k + 50)})
        wait_for(lambda: len(_out(out)) >= len(ids), client, limit_s=120)
    finally:
        client.cancel()
    assert _out(out) == sorted(ids)


# -- positions by time, out of range, group offsets ------------------------------------------------------
def test_start_and_stop_by_timestamp_use_the_records_create_time(
    apache_kafka: ApacheKafkaBroker, kafka_topic: Topic, tmp_path: Path
) -> None:
    """``OffsetsInitializer.timestamp`` looks records up by their CreateTime, record-exact inside a batch; a
    time after the last record, and an empty partition, resolve to the partition's end."""
    t = kafka_topic(3)
    t0 = 1_700_000_000_000
    prod = Producer({"bootstrap.servers": apache_kafka.bootstrap, "linger.ms": 50, "log_level": 0})
    for i, v in enumerate(json_values(20)):  # one batch: tansu looked up batches by ingestion time
        prod.produce(t, v, partition=0, timestamp=t0 + 1000 * i)
    for i, v in enumerate(json_values(5, 100)):  # all older than the start
        prod.produce(t, v, partition=2, timestamp=t0 - 60_000 + i)
    assert prod.flush(30) == 0  # partition 1 stays empty
    _run(apache_kafka.bootstrap, t, tmp_path / "a", tmp_path / "ca",
         starting_offsets=OffsetsInitializer.timestamp(t0 + 4500),
         stopping_offsets=OffsetsInitializer.timestamp(t0 + 12_000))  # fmt: skip
    assert _out(tmp_path / "a") == list(range(5, 12))  # CreateTime t0+5000 .. t0+11000
    _run(apache_kafka.bootstrap, t, tmp_path / "b", tmp_path / "cb",
         starting_offsets=OffsetsInitializer.timestamp(t0 + 15_000),
         stopping_offsets=OffsetsInitializer.timestamp(t0 + 10**9))  # after every record: the end  # fmt: skip
    assert _out(tmp_path / "b") == list(range(15, 20))


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_restored_position_below_the_log_start_is_data_loss(
    apache_kafka: ApacheKafkaBroker, kafka_topic: Topic, tmp_path: Path, fail_on_data_loss: bool
) -> None:
    """Records after a checkpoint's position deleted (DeleteRecords, as retention does): the restored run
    fails naming topic, partition and offset, or with ``fail_on_data_loss=False`` goes on at the log start
    and counts the reset."""
    t, out = kafka_topic(1), tmp_path / "out"
    first = produce_json(apache_kafka, t, {0: range(0, 100)})
    _run(apache_kafka.bootstrap, t, out, tmp_path, stopping_offsets="latest")
    produce_json(apache_kafka, t, {0: range(100, 200)})
    tp = TopicPartition(t, 0, 150)
    assert apache_kafka.admin.delete_records([tp])[tp].result(30).low_watermark == 150
    p = pipeline("ak", tmp_path, parallelism=1, restart=NoRestart())
    p.source(KafkaSource(apache_kafka.bootstrap, t, format="json", schema=SCHEMA, stopping_offsets="latest",
                         fail_on_data_loss=fail_on_data_loss)).sink(TwoPhaseCommitTestSink(str(out)))  # fmt: skip
    if fail_on_data_loss:
        with pytest.raises(JobFailedError) as info:
            p.run(runtime="local", restore="latest")
        cause = info.value.__cause__
        assert isinstance(cause, KafkaDataLossError), cause
        assert (cause.topic, cause.partition, cause.offset) == (t, 0, 100)
        assert _out(out) == first
    else:
        result = p.run(runtime="local", restore="latest")
        assert _out(out) == [*first, *range(150, 200)]
        assert result.metrics.get("data_loss_resets") == 1


def test_offsets_committed_on_checkpoint_and_resumed_from(
    apache_kafka: ApacheKafkaBroker, kafka_topic: Topic, tmp_path: Path
) -> None:
    """Each completed checkpoint's positions go to the consumer group (read back by a plain consumer), and a
    run starting at ``committed`` reads on from there."""
    t = kafka_topic(2)
    produce_json(apache_kafka, t, {0: range(0, 100), 1: range(100, 150)})
    group = f"lag-{t}"
    _run(apache_kafka.bootstrap, t, tmp_path / "a", tmp_path / "ca", group_id=group, stopping_offsets="latest")
    c = Consumer({"bootstrap.servers": apache_kafka.bootstrap, "group.id": group, "log_level": 0})
    try:
        committed = c.committed([TopicPartition(t, 0), TopicPartition(t, 1)], timeout=10)
    finally:
        c.close()
    assert {x.partition: x.offset for x in committed} == {0: 100, 1: 50}
    more = produce_json(apache_kafka, t, {0: range(1000, 1010), 1: range(2000, 2005)})
    _run(apache_kafka.bootstrap, t, tmp_path / "b", tmp_path / "cb", group_id=group,
         starting_offsets=OffsetsInitializer.committed(), stopping_offsets="latest")  # fmt: skip
    assert _out(tmp_path / "b") == sorted(more)


def test_a_starting_offset_below_the_log_start_fails_or_is_skipped_as_asked(
    apache_kafka: ApacheKafkaBroker, kafka_topic: Topic, tmp_path: Path
) -> None:
    """An explicit starting offset under the partition's start (moved by ``DeleteRecords``):
    ``fail_on_data_loss`` names topic, partition and offset; without it the reader resets to the start,
    counts it and reads on (a restored position: the test above)."""
    t = kafka_topic(1)
    apache_kafka.produce(t, json_values(20), partition=0)
    tp = TopicPartition(t, 0, 8)
    assert apache_kafka.admin.delete_records([tp])[tp].result(30).low_watermark == 8
    start = {(t, 0): 3}  # under the new start (8): out of range
    stop = {(t, 0): 20}
    p = pipeline("loss-fail", tmp_path / "fail", parallelism=1, restart=NoRestart())
    p.source(KafkaSource(apache_kafka.bootstrap, t, format="json", schema=SCHEMA, starting_offsets=start,
                         stopping_offsets=stop)).sink(TwoPhaseCommitTestSink(str(tmp_path / "fail-out")))  # fmt: skip
    with pytest.raises(JobFailedError) as info:
        p.run(runtime="local", restore="none")
    cause = info.value.__cause__
    assert isinstance(cause, KafkaDataLossError), cause
    assert (cause.topic, cause.partition, cause.offset) == (t, 0, 3)
    p = pipeline("loss-skip", tmp_path / "skip", parallelism=1, restart=NoRestart())
    skip = KafkaSource(
        apache_kafka.bootstrap, t, format="json", schema=SCHEMA, starting_offsets=start, stopping_offsets=stop,
        fail_on_data_loss=False,
    )  # fmt: skip
    p.source(skip).sink(TwoPhaseCommitTestSink(str(tmp_path / "skip-out")))
    result = p.run(runtime="local", restore="none")
    assert committed_ids(read_committed(str(tmp_path / "skip-out"))) == list(range(8, 20))
    assert result.metrics.get("data_loss_resets", 0) >= 1, result.metrics


# -- partitions added while the job runs ---------------------------------------------------------------
def test_partitions_added_while_the_job_runs_are_read_from_their_start(
    apache_kafka: ApacheKafkaBroker, kafka_topic: Topic, tmp_path: Path
) -> None:
    """CreatePartitions on the topic a running job reads (tansu cannot: its emulation re-creates the topic):
    discovery assigns the new partitions at their earliest offset, the old ones read on."""
    t, out = kafka_topic(2), tmp_path / "out"
    ids = produce_json(apache_kafka, t, {0: range(0, 300), 1: range(1000, 1300)})
    p = pipeline("ak-grow", tmp_path, parallelism=3)
    p.source(KafkaSource(apache_kafka.bootstrap, t, format="json", schema=SCHEMA, discovery_interval_s=0.2)).sink(
        TwoPhaseCommitTestSink(str(out))
    )
    client = p.start(runtime="local", restore="none")
    try:
        wait_for(lambda: len(_out(out)) >= len(ids), client)
        apache_kafka.add_partitions(t, 5)
        ids += produce_json(apache_kafka, t, {q: range(q * 1000, q * 1000 + 120) for q in (2, 3, 4)})
        ids += produce_json(apache_kafka, t, {0: range(300, 350)})
        wait_for(lambda: len(_out(out)) >= len(ids), client, limit_s=120)
    finally:
        client.cancel()
    assert _out(out) == sorted(ids)


# -- consumer lag --------------------------------------------------------------------------------------
@pytest.fixture
def gate() -> Iterator[threading.Event]:
    g = threading.Event()
    yield g
    g.set()


def _lag_job(bootstrap: str, t: str, tmp_path: Path, gate: threading.Event) -> Pipeline:
    def held(batch: pa.RecordBatch) -> pa.RecordBatch:
        gate.wait(120)  # the reader cannot emit past what the job holds: there is lag
        return batch

    p = Pipeline("lagging", parallelism=1, checkpoint=CheckpointConfig(interval=0.2, storage=str(tmp_path / "chk")))
    p.source(KafkaSource(bootstrap, t, format="json", schema=SCHEMA, batch_size=50)).map_batches(held).sink(
        TwoPhaseCommitTestSink(str(tmp_path / "out"))
    )
    return p


@pytest.mark.parametrize("transactional", [False, True])
def test_consumer_lag_counts_what_is_left_and_reaches_zero(
    apache_kafka: ApacheKafkaBroker, kafka_topic: Topic, tmp_path: Path, gate: threading.Event, transactional: bool
) -> None:
    """The lag gauge (from librdkafka's statistics: the last stable offset less the reader's positions) is
    above zero and at most what was produced while the job is held, and exactly zero once everything is
    read, also when the input is transactional (each commit leaves a marker at the end of the partition)."""
    t = kafka_topic(2)
    if transactional:
        p = _transactional(apache_kafka.bootstrap, f"{t}-in")
        ids = [i for k in range(4) for i in _txn(p, t, range(k * 1000, k * 1000 + 500), commit=True)]
    else:
        ids = produce_json(apache_kafka, t, {0: range(0, 2000), 1: range(2000, 4000)})
    client = _lag_job(apache_kafka.bootstrap, t, tmp_path, gate).start(runtime="local", restore="none")
    try:
        def lag() -> float:
            gauges = client.monitor.vertex_totals()[0]["gauges"]
            return float(gauges.get("kafka_lag_records", -1))

        wait_for(lambda: lag() > 0, client)
        assert 0 < lag() <= sum(apache_kafka.end_offsets(t).values())  # records and markers not emitted
        counters = client.monitor.vertex_totals()[0]["counters"]
        assert counters["kafka_fetched_records"] > 0 and counters["kafka_fetched_bytes"] > 0
        gate.set()
        wait_for(lambda: len(_out(tmp_path / "out")) >= len(ids), client, limit_s=120)
        try:
            wait_for(lambda: lag() == 0, client)  # within a statistics interval or two
        except AssertionError:
            raise AssertionError(f"the lag stays at {lag()} after every record was read") from None
    finally:
        client.cancel()
    assert _out(tmp_path / "out") == sorted(ids)


# -- a broker crash during a run -----------------------------------------------------------------------
@pytest.fixture
def own_broker() -> Iterator[ApacheKafkaBroker]:
    """An Apache Kafka of the test's own: it is crashed and restarted, which the session's must not be."""
    with ApacheKafkaBroker() as b:
        yield b


def test_the_job_rides_out_a_broker_crash_and_stays_exactly_once(own_broker: ApacheKafkaBroker, tmp_path: Path) -> None:
    """The only broker is killed (SIGKILL) while the job reads and started again on its data: the job reads
    on without a restart of its own, its output is the input once, and the group offsets committed after
    the crash are where it is."""
    b, t, out = own_broker, "crash", tmp_path / "out"
    b.create_topic(t, 2)
    ids = produce_json(b, t, {0: range(0, 3000), 1: range(10_000, 13_000)})
    p = pipeline("ak-crash", tmp_path, parallelism=2)
    p.source(KafkaSource(b.bootstrap, t, format="json", schema=SCHEMA, batch_size=100, group_id="crash")).map_batches(
        slow
    ).sink(TwoPhaseCommitTestSink(str(out)))
    client = p.start(runtime="local", restore="none")
    try:
        wait_for(lambda: len(_out(out)) >= 500, client, limit_s=120)
        b.kill()  # the job's consumers are connected; what comes next is fetched from the restarted broker
        done = int(client.monitor.overview()["checkpoint_counts"]["completed"])
        wait_for(lambda: int(client.monitor.overview()["checkpoint_counts"]["completed"]) >= done + 2, client)
        b.start()
        ids += produce_json(b, t, {0: range(3000, 3500), 1: range(13_000, 13_500)})
        wait_for(lambda: len(_out(out)) >= len(ids), client, limit_s=180)
        ends = b.end_offsets(t)
        group = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "crash", "log_level": 0})
        try:
            def at_end() -> bool:
                found = group.committed([TopicPartition(t, 0), TopicPartition(t, 1)], timeout=10)
                return {x.partition: x.offset for x in found} == ends

            wait_for(at_end, client)
        finally:
            group.close()
        assert client.monitor.overview()["restarts"] == 0
    finally:
        client.cancel()
    record("broker-crash", "apache-kafka-sigkill", "kafka->test-sink", "broker-sigkill", True, 0, _out(out), ids)
    assert _out(out) == sorted(ids)
