"""KafkaSink's transactions on Apache Kafka (the ``apache_kafka`` fixture: a real KRaft broker), judged by a
plain ``read_committed`` consumer (tests/kafka_test_broker.py): nothing deduplicated, nothing reinterpreted by
the sink's headers, so a record committed twice counts twice and a record of an aborted transaction counts
if the broker hands it out.

Fencing of a crashed attempt's producer (its commit never lands), a crash inside the publish of a transaction
of more than 10,000 records, the markers deciding what a restore publishes, and the markers as the output's
lineage record. Process kills (SIGKILL of the whole job) inside large publishes are in
tests/faults/test_kafka_sink_kills.py; crashes at every lifecycle point in tests/faults/test_external_sinks.py.
"""

from __future__ import annotations

import json
import shutil
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import KafkaException, TopicPartition
from sluice import CheckpointConfig, FixedDelayRestart, Pipeline
from sluice.connectors.kafka import KafkaSource
from sluice.errors import JobFailedError, RestoreError
from sluice.sinks.kafka import KafkaSink
from sluice.sinks.kafka.encoding import RecordEncoder
from sluice.sinks.kafka.transactions import KafkaCommittable, Publisher, read_marker
from sluice.testing.faults import FaultInjector

from tests.apache_kafka import ApacheKafkaBroker
from tests.faults.shapes import record
from tests.sinks.kafka.reader import read_topic

pytestmark = pytest.mark.faults

#: the size of the transactions the crash tests publish: the issue's failing runs had about 7,000
LARGE = 12_000


def _committable(tid: str, checkpoint: int, ids: range, partitions: int = 1) -> KafkaCommittable:
    """Records ``{"id": i}`` of checkpoint ``checkpoint``, spread over ``partitions`` partitions."""
    options = KafkaSink("unused:1", "unused").options
    records = pa.Table.from_batches([RecordEncoder(options, partitions).encode(pa.record_batch({"id": pa.array(ids, pa.int64())}))])
    return KafkaCommittable(tid, 0, checkpoint, records)


def _ids(broker: ApacheKafkaBroker, topic: str) -> Counter[int]:
    """What a read_committed consumer reads, as a multiset of ids."""
    return Counter(json.loads(r.value)["id"] for r in broker.read_committed(topic) if r.value is not None)


def _settled(broker: ApacheKafkaBroker, topic: str, timeout: float = 60.0) -> bool:
    """Wait until no transaction on ``topic`` is open (last stable offset = end offset); False at the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if broker.stable_offsets(topic) == broker.end_offsets(topic):
            return True
        time.sleep(0.05)
    return False


def _crash(point: str) -> None:
    raise RuntimeError(f"crash at {point}: records sent, transaction open")


def test_a_crashed_attempts_producer_is_fenced_and_its_commit_never_lands(
    apache_kafka: ApacheKafkaBroker, kafka_topic: Callable[..., str]
) -> None:
    """A publisher of a crashed attempt sent checkpoint 5's records and holds its transaction open. The
    restore's ``recover()`` fences the transactional id (the open transaction is aborted) and publishes
    checkpoint 5 itself. Then the zombie goes on: it commits its transaction, and tries to publish checkpoint 6.
    Kafka refuses both (PRODUCER_FENCED, fatal): the output holds checkpoint 5's records once, the marker
    stays at 5."""
    t = kafka_topic(2)
    sink = KafkaSink(apache_kafka.bootstrap, t)
    tid = f"sluice-zombie-{t}-0"
    five, six = _committable(tid, 5, range(LARGE), 2), _committable(tid, 6, range(LARGE, LARGE + 100), 2)
    zombie = Publisher(sink.options, tid)
    with pytest.raises(RuntimeError):
        zombie.publish(five, _crash)
    assert apache_kafka.stable_offsets(t) != apache_kafka.end_offsets(t), "the zombie's transaction is not open"
    sink.recover("zombie-job", [five])
    assert _settled(apache_kafka, t), "recover() left the zombie's transaction open"
    fresh = Publisher(sink.options, tid)
    assert fresh.marker == 0 and fresh.publish(five, lambda p: None) is True
    with pytest.raises(KafkaException) as fenced:
        zombie.producer.send_offsets_to_transaction(
            [TopicPartition(t, 0, 5)], zombie.consumer.consumer_group_metadata(), 10
        )  # fmt: skip
        zombie.producer.commit_transaction(10)
    assert fenced.value.args[0].fatal(), fenced.value  # the producer is unusable from now on
    with pytest.raises(KafkaException):
        zombie.publish(six, lambda p: None)
    assert read_marker(fresh.consumer, sink.options, 10) == 5
    assert fresh.publish(five, lambda p: None) is False  # the marker says: published
    assert _settled(apache_kafka, t)
    assert _ids(apache_kafka, t) == Counter(range(LARGE))
    assert len(read_topic(apache_kafka, t)) >= 2 * LARGE, "the zombie's aborted records are not on the broker"
    zombie.close()
    fresh.close()


def test_committed_checkpoint_settles_earlier_transactions_before_it_reads_the_markers(
    apache_kafka: ApacheKafkaBroker, kafka_topic: Callable[..., str]
) -> None:
    """A crashed attempt left a transaction open that carries marker 7 (checkpoint 6 was published). The
    lineage check's ``committed_checkpoint`` fences the job's ids first, then reads stable markers: it answers
    6 at once (the open transaction aborted, not waited for until it times out) and nothing of the job's
    earlier attempts can move a marker after that read."""
    t = kafka_topic(1)
    sink = KafkaSink(apache_kafka.bootstrap, t)
    job = f"lineage-{t}"
    tid = f"{sink.options.txn_prefix(job)}-0"
    p = Publisher(sink.options, tid)
    assert p.publish(_committable(tid, 6, range(100)), lambda point: None) is True
    with pytest.raises(RuntimeError):
        p.publish(_committable(tid, 7, range(100, 200)), _crash)
    started = time.monotonic()
    assert sink.committed_checkpoint(job, "uid") == 6
    assert time.monotonic() - started < sink.options.transaction_timeout_s / 2
    assert apache_kafka.stable_offsets(t) == apache_kafka.end_offsets(t), "the open transaction was not aborted"
    assert _ids(apache_kafka, t) == Counter(range(100))
    p.close()


def _kafka_job(
    broker: ApacheKafkaBroker, src: str, out: str, tmp: Path, faults: Any = None, interval: float = 0.05, parallelism: int = 2
) -> Any:
    p = Pipeline(f"k2k-{out}", parallelism=parallelism, restart=FixedDelayRestart(attempts=4, delay=0),
                 checkpoint=CheckpointConfig(interval=interval, storage=str(tmp / "chk")))  # fmt: skip
    ends = broker.end_offsets(src)
    source = KafkaSource(broker.bootstrap, src, format="json", schema=pa.schema([("id", pa.int64())]),
                         batch_size=500, stopping_offsets={(src, q): e for q, e in ends.items()})  # fmt: skip
    p.source(source).sink(KafkaSink(broker.bootstrap, out))
    return p.run(runtime="local", restore="none", faults=faults)


def test_a_crash_inside_the_publish_of_a_large_transaction(
    apache_kafka: ApacheKafkaBroker, kafka_topic: Callable[..., str], tmp_path: Path
) -> None:
    """Kafka -> Kafka at parallelism 1, one checkpoint (the final one: the interval is longer than the run)
    holding all 24,000 records (at parallelism 2 the reader that ends first triggers a checkpoint while the
    other is still reading, so the sizes would depend on timing). The crash hits its publish with every
    record sent and the transaction open; the restore aborts it and publishes the checkpoint again: a
    read_committed reader reads every input record once, and the aborted copy (at least 10,000 records) is
    on the broker, invisible to it."""
    src, out = kafka_topic(2), kafka_topic(3)
    for q in (0, 1):
        apache_kafka.produce(src, [json.dumps({"id": q * 10**6 + i}).encode() for i in range(LARGE)], partition=q)
    expected = Counter(q * 10**6 + i for q in (0, 1) for i in range(LARGE))
    faults = FaultInjector(point="commit", after=0)
    result = _kafka_job(apache_kafka, src, out, tmp_path, faults, interval=600.0, parallelism=1)
    got = _ids(apache_kafka, out)
    aborted = len(read_topic(apache_kafka, out)) - sum(got.values())
    fired = faults.all_fired and aborted >= 10_000
    record("kafka-sink-job", "crash-inside-large-publish", "kafka->kafka", "aligned", fired, faults.crashes,
           list(got.elements()), list(expected.elements()))  # fmt: skip
    assert faults.all_fired and result.attempts >= 2, faults.fired
    assert aborted >= 10_000, f"the crashed transaction held {aborted} records, not >= 10,000"
    assert got == expected, f"{sum((expected - got).values())} lost, {sum((got - expected).values())} duplicated"


def test_lineage_refuses_a_rerun_from_nothing(
    apache_kafka: ApacheKafkaBroker, kafka_topic: Callable[..., str], tmp_path: Path
) -> None:
    """The markers are the output's lineage record: a rerun of the job without its checkpoints is refused."""
    src, out = kafka_topic(1), kafka_topic(1)
    apache_kafka.produce(src, [json.dumps({"id": i}).encode() for i in range(50)], partition=0)
    _kafka_job(apache_kafka, src, out, tmp_path)
    sink = KafkaSink(apache_kafka.bootstrap, out)
    assert sink.committed_checkpoint(f"k2k-{out}", "uid") > 0
    assert sink.committed_checkpoint("another-job", "uid") == 0
    shutil.rmtree(tmp_path / "chk")
    with pytest.raises((RestoreError, JobFailedError)) as refused:
        _kafka_job(apache_kafka, src, out, tmp_path)
    assert "\n" not in str(refused.value) and "checkpoint" in str(refused.value)
    assert _ids(apache_kafka, out) == Counter(range(50))
