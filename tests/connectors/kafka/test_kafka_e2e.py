"""End-to-end: Kafka -> KafkaSource -> pipeline -> TwoPhaseCommitTestSink on the local runtime.

Exactly-once is checked by comparing the committed output (``read_committed``) with what was produced:
same sorted ids, so nothing is lost and nothing is duplicated, across injected faults and restores.

Where the broker's semantics decide (transactions, "latest", added partitions, the dead-letter topic) the
tests run on Apache Kafka (``apache_kafka``); the others on tansu (``broker``), each saying why its quirks
(tests/broker_quirks/README.md) do not matter to it. More on Apache Kafka: test_apache_kafka_source.py.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from sluice.api import JobClient, Pipeline
from sluice.config import FixedDelayRestart, NoRestart, RestartStrategy
from sluice.connectors.kafka import KafkaSource, KafkaSourceError
from sluice.connectors.kafka.offsets import owner_of
from sluice.errors import BadRecordError, JobFailedError
from sluice.sinks.testing import TwoPhaseCommitTestSink, read_committed
from sluice.source import SourceSplit
from sluice.testing.faults import FaultInjector

from tests.apache_kafka import ApacheKafkaBroker
from tests.connectors.kafka.helpers import committed_ids, json_values, produce_json
from tests.kafka_broker import TansuBroker
from tests.kafka_test_broker import read_committed as read_topic

pytestmark = [pytest.mark.kafka, pytest.mark.usefixtures("kafka_reader")]  # on both readers

SCHEMA = pa.schema([("id", pa.int64()), ("p", pa.int64()), ("ts", pa.int64())])
RETRY = FixedDelayRestart(attempts=5, delay=0)


def pipeline(name: str, tmp_path: Path, parallelism: int = 2, restart: RestartStrategy = RETRY) -> Pipeline:
    return Pipeline(
        name,
        parallelism=parallelism,
        restart=restart,
        checkpoint={"interval": 0.05, "storage": str(tmp_path / "chk")},
    )


def slow(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Let checkpoints interleave with the (otherwise instant) bounded reads."""
    time.sleep(0.003)
    return batch


def wait_for(predicate: Callable[[], bool], client: JobClient | None = None, limit_s: float = 30.0) -> None:
    """Poll until ``predicate`` holds (a generous safety limit, not a timing assertion)."""
    deadline = time.monotonic() + limit_s
    while not predicate():
        if client is not None and not client.running:
            client.wait()  # raises the job's failure
            raise AssertionError("the job ended before the condition held")
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.05)


def stops(broker: TansuBroker, topic: str) -> dict[tuple[str, int], int]:
    """The end offsets as an explicit stop map: on tansu, whose ListOffsets(LATEST) under-reports the high
    watermark (tests/broker_quirks/high_watermark.py), from a fetch (``TansuBroker.end_offsets``). On
    Apache Kafka a test gives ``stopping_offsets="latest"``."""
    return {(topic, p): off for p, off in broker.end_offsets(topic).items()}


#: why the tansu tests here may stay on tansu: their input is plain records produced before the job, read
#: to explicit stop offsets from the fetched end (high_watermark.py), with no transactions (transactions.py),
#: timestamps lookups (offsets_for_times.py), out-of-range positions (seek_out_of_range.py) or new partitions
TANSU_OK = pytest.mark.tansu(
    "plain records, explicit stops from the fetched end: ListOffsets(LATEST), aborted records, timestamp "
    "lookups, OFFSET_OUT_OF_RANGE and CreatePartitions do not matter"
)


# -- exactly-once under faults -------------------------------------------------------------------------
@pytest.mark.faults
@TANSU_OK
@pytest.mark.parametrize("point", ["source", "snapshot_to_ack", "complete_to_commit", "final_checkpoint"])
def test_bounded_exactly_once_with_fault(
    broker: TansuBroker, topic: Callable[..., str], tmp_path: Path, point: str
) -> None:
    t = topic(3)
    ids = produce_json(broker, t, {0: range(0, 1200), 1: range(1200, 2000), 2: range(2000, 2300)})
    faults = FaultInjector(point=point, after={"source": 12, "final_checkpoint": 0}.get(point, 3))
    p = pipeline(f"eo-{point}", tmp_path)
    (
        p.source(
            KafkaSource(
                broker.bootstrap,
                t,
                format="json",
                schema=SCHEMA,
                batch_size=100,
                stopping_offsets=stops(broker, t),
            )
        )
        .map_batches(slow)
        .sink(TwoPhaseCommitTestSink(str(tmp_path / "out")))
    )
    result = p.run(runtime="local", faults=faults, restore="none")
    assert faults.fired, "the fault must have fired"
    assert result.attempts >= 2
    assert committed_ids(read_committed(str(tmp_path / "out"))) == sorted(ids)


@pytest.mark.faults
def test_dead_letters_go_to_a_dead_letter_topic_exactly_once(
    apache_kafka: ApacheKafkaBroker, kafka_topic: Callable[..., str], tmp_path: Path
) -> None:
    """Malformed records, with topic, partition and offset, to a dead-letter topic (a KafkaSink) through a
    crash and a restore: a plain read_committed consumer of that topic sees each bad record once."""
    from sluice.sinks.kafka import KafkaSink

    t, dead_topic = kafka_topic(2), kafka_topic(1)
    good: list[int] = []
    bad: dict[tuple[int, int], str] = {}
    for part in (0, 1):
        values = []
        for i in range(600):
            if i % 37 == 5:
                values.append(b'{"id": broken' + str(i).encode())
                bad[(part, i)] = values[-1].decode()
            else:
                values.append(json.dumps({"id": part * 10_000 + i, "p": part, "ts": i}).encode())
                good.append(part * 10_000 + i)
        apache_kafka.produce(t, values, partition=part)
    faults = FaultInjector(point="source", after=8)
    p = pipeline("dead-letters", tmp_path)
    stream = p.source(
        KafkaSource(
            apache_kafka.bootstrap,
            t,
            format="json",
            schema=SCHEMA,
            batch_size=50,
            on_bad_record="dead_letter",
            stopping_offsets="latest",
        )
    )
    stream.map_batches(slow).sink(TwoPhaseCommitTestSink(str(tmp_path / "out")))
    stream.side_output("dead_letters").sink(KafkaSink(apache_kafka.bootstrap, dead_topic, name="dead"), name="dead")
    result = p.run(runtime="local", faults=faults, restore="none")
    assert faults.fired and result.attempts >= 2
    assert committed_ids(read_committed(str(tmp_path / "out"))) == sorted(good)
    letters = [json.loads(r.value or b"null") for r in read_topic(apache_kafka.bootstrap, dead_topic)]
    got = sorted((d["partition"], d["offset"]) for d in letters)
    assert got == sorted(bad), "each bad record exactly once in the dead-letter topic"
    assert all(d["topic"] == t and d["value_text"] == bad[(d["partition"], d["offset"])] and d["error"] for d in letters)
    assert result.metrics.get("bad_records", 0) >= len(bad)


# -- unbounded: discovery and rescaling ----------------------------------------------------------------
@TANSU_OK
def test_discovers_new_topics_while_running(
    broker: TansuBroker, topic: Callable[..., str], tmp_path: Path
) -> None:
    base = topic(2)
    ids = produce_json(broker, base, {0: range(0, 300), 1: range(300, 600)})
    out = str(tmp_path / "out")
    p = pipeline("discovery", tmp_path)
    p.source(
        KafkaSource(
            broker.bootstrap,
            topic_pattern=f"{base}(-more.*)?",
            format="json",
            schema=SCHEMA,
            discovery_interval_s=0.2,
        )
    ).sink(TwoPhaseCommitTestSink(out))
    client = p.start(runtime="local", restore="none")
    try:
        wait_for(lambda: len(committed_ids(read_committed(out))) == len(ids), client)
        for n, suffix in ((3, "-more-a"), (1, "-more-b")):  # new partitions of new topics: start at earliest
            broker.create_topic(base + suffix, n)
            ids += produce_json(
                broker, base + suffix, {q: range(1000 * (q + n), 1000 * (q + n) + 70) for q in range(n)}
            )
        ids += produce_json(broker, base, {0: range(900, 950)})
        wait_for(lambda: len(committed_ids(read_committed(out))) >= len(ids), client)
    finally:
        client.cancel()
    assert committed_ids(read_committed(out)) == sorted(ids)


class RecordingContext:
    """EnumeratorContext that records assignments."""

    def __init__(self, parallelism: int) -> None:
        self.parallelism = parallelism
        self.assigned: dict[int, list[SourceSplit]] = {}
        self.no_more: list[int] = []

    def assign_splits(self, assignment: dict[int, list[SourceSplit]]) -> None:
        for r, splits in assignment.items():
            self.assigned.setdefault(r, []).extend(splits)

    def signal_no_more_splits(self, subtask: int) -> None:
        self.no_more.append(subtask)

    def registered_readers(self) -> list[int]:
        return list(range(self.parallelism))


def test_enumerator_discovers_added_partitions_at_earliest(
    apache_kafka: ApacheKafkaBroker, kafka_topic: Callable[..., str]
) -> None:
    # the enumerator's view (assignments, its snapshot); a running job: test_apache_kafka_source.py
    broker, t = apache_kafka, kafka_topic(2)
    produce_json(broker, t, {0: range(10), 1: range(10, 15)})
    src = KafkaSource(broker.bootstrap, t, starting_offsets={(t, 0): 4, (t, 1): 5})
    ctx = RecordingContext(parallelism=3)
    enum = src.create_enumerator(ctx, None)
    enum.start()
    for r in range(3):
        enum.add_reader(r)
    assert {s.split_id: s.position for ss in ctx.assigned.values() for s in ss} == {f"{t}:0": 4, f"{t}:1": 5}
    state = enum.snapshot_state(1)
    broker.add_partitions(t, 4)  # CreatePartitions (tansu lacks it)
    produce_json(broker, t, {2: range(100, 103)})
    for _ in range(100):  # the consumer's metadata may lag the admin client's for a moment
        enum.poll()
        got = {s.split_id: (r, s.position) for r, ss in ctx.assigned.items() for s in ss}
        if len(got) == 4:
            break
        time.sleep(0.05)
    assert got[f"{t}:2"] == (owner_of(t, 2, 3), 0) and got[f"{t}:3"] == (owner_of(t, 3, 3), 0)
    assert ctx.no_more == []  # unbounded: discovery goes on
    enum.close()
    # restored from the snapshot taken before: the new partitions are found again, nothing else
    ctx2 = RecordingContext(parallelism=3)
    enum2 = src.create_enumerator(ctx2, state)
    enum2.start()
    for r in range(3):
        enum2.add_reader(r)
    assert sorted(s.split_id for ss in ctx2.assigned.values() for s in ss) == [f"{t}:2", f"{t}:3"]
    enum2.close()


@pytest.mark.faults
@TANSU_OK
def test_restore_at_another_parallelism(
    broker: TansuBroker, topic: Callable[..., str], tmp_path: Path
) -> None:
    t = topic(5)
    ids = produce_json(broker, t, {q: range(q * 1000, q * 1000 + 400) for q in range(5)})
    out = str(tmp_path / "out")

    def job(parallelism: int) -> Pipeline:
        p = pipeline("rescale", tmp_path, parallelism=parallelism)
        p.source(KafkaSource(broker.bootstrap, t, format="json", schema=SCHEMA, batch_size=100)).map_batches(
            slow
        ).sink(TwoPhaseCommitTestSink(out))
        return p

    faults = FaultInjector(point="source", after=6)
    client = job(2).start(runtime="local", faults=faults, restore="none")
    try:
        wait_for(lambda: bool(faults.fired) and len(committed_ids(read_committed(out))) >= 1000, client)
    finally:
        client.cancel()
    ids += produce_json(broker, t, {q: range(q * 1000 + 400, q * 1000 + 500) for q in range(5)})
    client = job(3).start(runtime="local", restore="latest")
    try:
        wait_for(lambda: len(committed_ids(read_committed(out))) >= len(ids), client)
    finally:
        client.cancel()
    assert committed_ids(read_committed(out)) == sorted(ids)


# -- positions -----------------------------------------------------------------------------------------
def test_explicit_start_and_latest_stop(
    apache_kafka: ApacheKafkaBroker, kafka_topic: Callable[..., str], tmp_path: Path
) -> None:
    t = kafka_topic(1)
    apache_kafka.produce(t, json_values(12), partition=0)  # one batch: tansu's "latest" under-reported it
    p = pipeline("start-stop", tmp_path, parallelism=1)
    p.source(
        KafkaSource(
            apache_kafka.bootstrap,
            t,
            format="json",
            schema=SCHEMA,
            starting_offsets={(t, 0): 5},
            stopping_offsets="latest",
        )
    ).sink(TwoPhaseCommitTestSink(str(tmp_path / "out")))
    p.run(runtime="local", restore="none")
    assert committed_ids(read_committed(str(tmp_path / "out"))) == list(range(5, 12))


def test_transaction_markers_aborted_records_and_stop_on_marker(
    apache_kafka: ApacheKafkaBroker, kafka_topic: Callable[..., str], tmp_path: Path
) -> None:
    """Committed transactions are read, an aborted one in between is not (the broker leaves it out of a
    read_committed fetch: tansu did not), and a stop offset on the last commit marker ends the run."""
    t = kafka_topic(1)
    tx = Producer({"bootstrap.servers": apache_kafka.bootstrap, "transactional.id": f"tx-{t}", "log_level": 0})
    tx.init_transactions(30)
    for start, n, commit in ((0, 5, True), (100, 4, False), (5, 2, True)):
        tx.begin_transaction()
        for v in json_values(n, start):
            tx.produce(t, v, partition=0)
        tx.flush(30)
        (tx.commit_transaction if commit else tx.abort_transaction)(30)
    end = apache_kafka.end_offsets(t)[0]  # the last offset is a commit marker: never delivered
    assert end == 14  # 11 records and 3 markers
    p = pipeline("txn", tmp_path, parallelism=1)
    p.source(
        KafkaSource(apache_kafka.bootstrap, t, format="json", schema=SCHEMA, stopping_offsets={(t, 0): end})
    ).sink(TwoPhaseCommitTestSink(str(tmp_path / "out")))
    p.run(runtime="local", restore="none")
    assert committed_ids(read_committed(str(tmp_path / "out"))) == list(range(7))


@TANSU_OK
def test_raw_format_columns(broker: TansuBroker, topic: Callable[..., str], tmp_path: Path) -> None:
    t = topic(1)
    prod = Producer({"bootstrap.servers": broker.bootstrap, "log_level": 0})
    prod.produce(t, b"v0", key=b"k0", partition=0, headers=[("h", b"1")], timestamp=1_700_000_000_123)
    prod.produce(t, None, key=b"k1", partition=0, timestamp=1_700_000_000_456)
    prod.flush(10)
    p = pipeline("raw", tmp_path, parallelism=1)
    p.source(KafkaSource(broker.bootstrap, t, stopping_offsets=stops(broker, t))).sink(
        TwoPhaseCommitTestSink(str(tmp_path / "out"))
    )
    p.run(runtime="local", restore="none")
    out = read_committed(str(tmp_path / "out"))
    assert out is not None
    rows: dict[str, Any] = out.sort_by("offset").to_pydict()
    assert rows["key"] == [b"k0", b"k1"] and rows["value"] == [b"v0", None]
    assert rows["topic"] == [t, t] and rows["partition"] == [0, 0] and rows["offset"] == [0, 1]
    assert rows["headers"][0] == [{"key": "h", "value": b"1"}]
    assert [ts.timestamp() for ts in rows["timestamp"]] == [1_700_000_000.123, 1_700_000_000.456]


# -- errors --------------------------------------------------------------------------------------------
@TANSU_OK
def test_fail_mode_error_names_the_record(
    broker: TansuBroker, topic: Callable[..., str], tmp_path: Path
) -> None:
    t = topic(1)
    broker.produce(t, [b'{"id": 1}', b'{"id": 2}', b"{garbage", b'{"id": 4}'], partition=0)
    p = pipeline("fail-mode", tmp_path, parallelism=1, restart=NoRestart())
    p.source(
        KafkaSource(broker.bootstrap, t, format="json", schema=SCHEMA, stopping_offsets=stops(broker, t))
    ).sink(TwoPhaseCommitTestSink(str(tmp_path / "out")))
    with pytest.raises(JobFailedError) as info:
        p.run(runtime="local", restore="none")
    cause = info.value.__cause__
    assert isinstance(cause, BadRecordError)
    assert (cause.topic, cause.partition, cause.offset, cause.snippet) == (t, 0, 2, b"{garbage")
    assert f"topic={t!r}, partition=0, offset=2" in str(cause)
    assert read_committed(str(tmp_path / "out")) is None


def test_unreachable_broker_is_named(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the test runs: nothing listens
    p = pipeline("unreachable", tmp_path, parallelism=1, restart=NoRestart())
    p.source(KafkaSource(f"127.0.0.1:{port}", "t", request_timeout_s=1.0)).sink(
        TwoPhaseCommitTestSink(str(tmp_path / "out"))
    )
    with pytest.raises(JobFailedError) as info:
        p.run(runtime="local", restore="none")
    assert isinstance(info.value.__cause__, KafkaSourceError)
    assert f"cannot reach the Kafka brokers at '127.0.0.1:{port}'" in str(info.value.__cause__)


@TANSU_OK
def test_missing_topic_is_named(broker: TansuBroker, tmp_path: Path) -> None:
    p = pipeline("missing", tmp_path, parallelism=1, restart=NoRestart())
    p.source(KafkaSource(broker.bootstrap, ["no-such-topic-xyz"])).sink(
        TwoPhaseCommitTestSink(str(tmp_path / "o"))
    )
    with pytest.raises(JobFailedError) as info:
        p.run(runtime="local", restore="none")
    assert isinstance(info.value.__cause__, KafkaSourceError)
    assert "topic(s) 'no-such-topic-xyz' not found" in str(info.value.__cause__)


# -- event time ----------------------------------------------------------------------------------------
@pytest.mark.tansu(
    "watermarks and idleness are the reader's: plain records, unbounded, no 'latest', "
    "transactions, timestamp lookups, out-of-range positions or new partitions"
)
def test_windows_close_on_per_partition_watermarks_past_an_idle_partition(
    broker: TansuBroker, topic: Callable[..., str], tmp_path: Path
) -> None:
    """An unbounded job: partition 0 carries 35 s of event time, partition 1 nothing. Windows close only
    as the watermark passes them, and the watermark moves only once partition 1 counts as idle: the
    10-second windows up to the records' last timestamp close (with every record), the last one stays open.
    Partition 0 gets a record at its last timestamp every half second while the test waits, so it is never
    idle itself (with both idle, no watermark is emitted) however the threads are scheduled."""
    from sluice.windows import count

    t = topic(2)
    t0 = 1_700_000_000_000
    broker.produce(t, [json.dumps({"k": "a", "ts": t0 + i * 1000}).encode() for i in range(35)], partition=0)
    out = str(tmp_path / "out")
    p = pipeline("watermarks", tmp_path, parallelism=1)
    src = KafkaSource(
        broker.bootstrap, t, format="json", schema=pa.schema([("k", pa.string()), ("ts", pa.int64())]),
        event_time="ts", idle_timeout_s=1.0,
    )  # fmt: skip
    p.source(src).key_by("k").tumbling_window("10 s", time="ts").aggregate(count()).sink(
        TwoPhaseCommitTestSink(out)
    )
    keep_alive = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "log_level": 0})
    last = json.dumps({"k": "a", "ts": t0 + 34_000}).encode()  # in the window that stays open
    client = p.start(runtime="local", restore="none")
    try:
        deadline = time.monotonic() + 120
        while (tbl := read_committed(out)) is None or tbl.num_rows < 3:
            assert client.running and time.monotonic() < deadline, "the windows did not close"
            keep_alive.produce(t, last, partition=0)
            keep_alive.flush(10)
            time.sleep(0.5)
    finally:
        client.cancel()
    got = read_committed(out)
    assert got is not None
    rows = sorted((r["window_start"], r["count"]) for r in got.to_pylist())
    assert rows == [(t0 - t0 % 10_000 + w * 10_000, n) for w, n in enumerate(_counts(t0))], rows


def _counts(t0: int) -> list[int]:
    """Records per 10 s window of ``t0 + i * 1000`` (i < 35) in the windows wholly before the last record."""
    last = t0 + 34_000
    first = t0 - t0 % 10_000
    return [
        sum(1 for i in range(35) if w <= t0 + i * 1000 < w + 10_000)
        for w in range(first, last, 10_000)
        if w + 10_000 <= last
    ]
