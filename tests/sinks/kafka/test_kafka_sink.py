"""KafkaSink's encoding on the tansu broker (fast, no JVM): formats (JSON, raw, Avro and JSON Schema through
the recorded schema registry, read back by the Kafka source), headers, keys and partitions (the Java client's
murmur2), record timestamps, at-least-once and best-effort delivery, transactional ids, and one-line errors.

None of these tests aborts a transaction or reads one in the middle of a run: each job commits once and is
read when finished, by a read_uncommitted reader (tests/sinks/kafka/reader.py), so tansu's transaction quirks
(aborted records delivered to read_committed consumers, concurrent commits left half done, fenced commits that
time out: tests/broker_quirks) do not matter here. Everything that depends on transaction semantics (fencing,
aborts, crashes in a publish, the markers) runs on Apache Kafka: tests/sinks/kafka/test_transactions.py."""

from __future__ import annotations

import datetime
import decimal
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from sluice import FixedDelayRestart, Pipeline
from sluice.connectors.kafka import KafkaSource
from sluice.errors import ConfigError, JobFailedError
from sluice.sinks.kafka import KafkaSink
from sluice.sinks.kafka.writer import StagingWriter
from sluice.sinks.testing import TwoPhaseCommitTestSink
from sluice.sinks.testing import read_committed as read_test_sink
from sluice.testing.conformance import SinkTarget
from sluice.testing.conformance.sink_harness import SinkAttempt

from tests.connectors.kafka.registry_server import RecordedSchemaRegistry
from tests.connectors.kafka.test_formats_units import EVENT_V1, ORDER_V1
from tests.kafka_broker import TansuBroker
from tests.sinks.kafka.reader import read_topic

pytestmark = [pytest.mark.kafka, pytest.mark.tansu(
    "the sink's encoding: each job commits one transaction, never aborted, read when finished with read_uncommitted "
    "(transactions.py, concurrent_transactions.py and fenced_commit.py do not apply)"
)]  # fmt: skip

_jobs = itertools.count()


def drive(sink: KafkaSink, batches: list[pa.RecordBatch], job: str | None = None) -> None:
    """One writer subtask writes ``batches``; one checkpoint completes and commits (the engine's lifecycle)."""
    a = SinkAttempt(SinkTarget(sink, lambda: None, lambda: []), 1, job or f"unit-{next(_jobs)}", 1)
    a.cycle(1, {0: batches}, last=True)
    a.close()


def murmur2_partition(key: bytes, partitions: int) -> int:
    """The Java client's default partitioner (murmur2 of the key's bytes, positive, mod partitions)."""
    m, h = 0x5BD1E995, (0x9747B28C ^ len(key)) & 0xFFFFFFFF
    for i in range(len(key) // 4):
        k = int.from_bytes(key[4 * i : 4 * i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        h = ((h * m) & 0xFFFFFFFF) ^ ((k * m) & 0xFFFFFFFF)
    tail = key[len(key) & ~3 :]
    if len(tail) == 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h = ((h ^ tail[0]) * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return (h & 0x7FFFFFFF) % partitions


def test_json_values_keys_headers_partitions_and_timestamps(broker: TansuBroker, topic: Callable[..., str]) -> None:
    t = topic(4)
    rows = pa.record_batch({
        "id": pa.array(range(40), pa.int64()),
        "user": [f"u{i % 7}" if i % 9 else None for i in range(40)],
        "text": [f'say "hi",\\ {i} é' for i in range(40)],
        "score": [i / 3 if i % 5 else None for i in range(40)],
        "ok": [i % 2 == 0 for i in range(40)],
        "ts": pa.array([1_700_000_000_000 + i for i in range(40)], pa.int64()),
        "trace": [f"trace-{i}" for i in range(40)],
    })  # fmt: skip
    sink = KafkaSink(broker.bootstrap, t, key_columns="user", header_columns=["trace"], headers={"source": "sluice"},
                     timestamp_column="ts")  # fmt: skip
    drive(sink, [rows])
    got = read_topic(broker, t)
    assert len(got) == 40
    by_id = {json.loads(r.value)["id"]: r for r in got}  # type: ignore[arg-type]
    for i, r in by_id.items():
        value = json.loads(r.value)  # type: ignore[arg-type]
        assert value == {"id": i, "user": rows["user"][i].as_py(), "text": rows["text"][i].as_py(),
                         "score": rows["score"][i].as_py(), "ok": i % 2 == 0}  # fmt: skip
        assert dict(r.headers) == {"source": b"sluice", "trace": f"trace-{i}".encode()}
        assert r.timestamp == 1_700_000_000_000 + i
        if r.key is not None:  # keyed rows land where the Java client puts them
            assert r.key == f"u{i % 7}".encode() and r.partition == murmur2_partition(r.key, 4)
    unkeyed = [r.partition for r in got if r.key is None]
    assert unkeyed and len(unkeyed) == len([i for i in range(40) if i % 9 == 0])


def test_json_of_other_types_raw_values_and_a_partition_column(broker: TansuBroker, topic: Callable[..., str]) -> None:
    t = topic(3)
    rows = pa.record_batch({
        "when": pa.array([datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)] * 3, pa.timestamp("us", "UTC")),
        "price": pa.array([decimal.Decimal("1.25")] * 3, pa.decimal128(6, 2)),
        "tags": [["a", "b"], [], None],
        "p": pa.array([2, 0, 1], pa.int32()),
    })  # fmt: skip
    drive(KafkaSink(broker.bootstrap, t, partition_by="p", key_columns=["p", "price"], key_format="json"), [rows])
    got = sorted(read_topic(broker, t), key=lambda r: r.partition)
    assert [r.partition for r in got] == [0, 1, 2]
    assert json.loads(got[2].value) == {"when": "2024-01-02T03:04:05+00:00", "price": "1.25", "tags": ["a", "b"]}  # type: ignore[arg-type]
    assert json.loads(got[2].key) == {"p": 2, "price": "1.25"}  # type: ignore[arg-type]
    raw = topic(1)
    payload = pa.record_batch({"k": ["a", "b"], "blob": [b"\x00\x01", b"\xff"]})
    drive(KafkaSink(broker.bootstrap, raw, key_columns="k", value_format="raw", value_columns=["blob"]), [payload])
    assert sorted((r.key, r.value) for r in read_topic(broker, raw)) == [(b"a", b"\x00\x01"), (b"b", b"\xff")]


def test_avro_and_json_schema_through_the_registry_read_back_by_the_source(
    broker: TansuBroker, topic: Callable[..., str], registry: RecordedSchemaRegistry, tmp_path: Path
) -> None:
    """The sink registers its schema under ``<topic>-value`` (ids 1 and 4 in the recordings) and writes the wire
    format; the Kafka source decodes it through the same registry."""
    orders = [{"id": i, "customer": f"c{i}-é", "amount": i + 0.5, "status": ["NEW", "PAID"][i % 2],
               "placed_at": datetime.datetime.fromtimestamp(1_700_000_000 + i, datetime.UTC), "note": None}
              for i in range(30)]  # fmt: skip
    for subject, fmt, schema, rows in (
        ("orders", "avro", ORDER_V1, pa.Table.from_pylist(orders).to_batches()[0]),
        ("events", "json_schema", EVENT_V1, pa.record_batch({"id": range(20), "kind": ["k"] * 20,
                                                              "score": range(20), "tags": [["x"]] * 20})),
    ):  # fmt: skip
        name = topic(2)
        sink = KafkaSink(broker.bootstrap, name, value_format=fmt, value_schema=schema, schema_registry=registry.url,
                         value_subject=f"{subject}-value")  # the recordings know orders-value and events-value
        drive(sink, [rows])
        out = tmp_path / name
        p = Pipeline(f"read-{name}", checkpoint={"interval": 0.2, "storage": str(tmp_path / f"chk-{name}")})
        src = KafkaSource(broker.bootstrap, name, format="avro" if fmt == "avro" else "json",
                          schema_registry=registry.url, stopping_offsets="latest")  # fmt: skip
        p.source(src).sink(TwoPhaseCommitTestSink(str(out)))
        p.run(runtime="local", restore="none")
        back = read_test_sink(str(out))
        assert back is not None and sorted(back.column("id").to_pylist()) == list(range(rows.num_rows)), subject
        if fmt == "avro":
            first = min(back.to_pylist(), key=lambda r: r["id"])
            assert (first["customer"], first["status"], first["placed_at"].timestamp()) == ("c0-é", "NEW", 1_700_000_000)
    assert registry.requests["POST /subjects/orders-value/versions"] == 1
    assert registry.requests["POST /subjects/events-value/versions"] == 1


def test_at_least_once_and_none_produce_at_once(broker: TansuBroker, topic: Callable[..., str]) -> None:
    for delivery in ("at_least_once", "none"):
        t = topic(2)
        sink = KafkaSink(broker.bootstrap, t, delivery=delivery)
        assert sink.create_committer(_Ctx()) is None and sink.committed_checkpoint("j", "u") is None
        w = sink.create_writer(_Ctx(), [])
        w.write(pa.record_batch({"id": range(25)}))
        assert w.prepare_commit(1) == []  # nothing to commit: at_least_once waited for the acknowledgements
        w.close()
        assert sorted(json.loads(r.value)["id"] for r in read_topic(broker, t)) == list(range(25))  # type: ignore[arg-type]


class _Ctx:
    subtask, parallelism, job_id, attempt = 0, 1, "ctx-job", 1

    def metric(self, name: str, increment: int = 1) -> None: ...
    def gauge(self, name: str, value: float) -> None: ...
    def fault_hook(self, point: str) -> None: ...


def test_transactional_ids_differ_by_job_sink_and_subtask_and_stay_across_restarts(broker: TansuBroker) -> None:
    sink = KafkaSink(broker.bootstrap, "t")

    def tid(job: str, subtask: int, attempt: int, s: KafkaSink = sink) -> str:
        ctx = _Ctx()
        ctx.job_id, ctx.subtask, ctx.attempt = job, subtask, attempt  # type: ignore[misc]
        w = s.create_writer(ctx, [])
        assert isinstance(w, StagingWriter)
        return w.transactional_id

    assert tid("a", 0, 1) == "sluice-a-t-0" == tid("a", 0, 7)  # a restart fences its earlier attempts
    assert len({tid("a", 0, 1), tid("a", 1, 1), tid("b", 0, 1), tid("a", 0, 1, KafkaSink(broker.bootstrap, "u"))}) == 4
    assert tid("a", 2, 1, KafkaSink(broker.bootstrap, "t", transactional_id_prefix="orders")) == "orders-2"


def test_options_are_checked_in_one_line(broker: TansuBroker, tmp_path: Path) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"delivery": "twice"}, "delivery"),
        ({"value_format": "avro"}, "schema_registry"),
        ({"key_columns": ["a", "b"]}, "key_format 'raw' takes one key column"),
        ({"key": ["a"]}, "KafkaSink: key= is now key_columns= (one name for the key columns of every sink)"),
        ({"producer_config": {"lingerr.ms": 5}}, "lingerr.ms"),
        ({"producer_config": {"transactional.id": "x"}}, "transactional_id_prefix"),
        ({"schema_registry": "http://user:pw@reg:8081"}, "username and password"),
        ({"transaction_timeout_s": 0}, "transaction_timeout_s"),
    ]
    for kwargs, words in cases:
        with pytest.raises(ConfigError) as err:
            KafkaSink(broker.bootstrap, "t", **kwargs)
        assert words in str(err.value) and "\n" not in str(err.value), str(err.value)
    secret = KafkaSink(broker.bootstrap, "t", producer_config={"sasl.password": "hunter2", "sasl.username": "u"})
    assert "hunter2" not in repr(secret) and "hunter2" not in repr(secret.options)
    assert secret.producer_config()["sasl.password"] == "***"
    p = Pipeline("bad-columns", checkpoint={"storage": str(tmp_path / "chk")})
    stream = p.source(KafkaSource(broker.bootstrap, "t", format="json", schema=pa.schema([("id", pa.int64())])))
    with pytest.raises(ConfigError) as err:
        stream.sink(KafkaSink(broker.bootstrap, "t", key_columns="nope"))
    assert "key_columns names column(s) ['nope']" in str(err.value)


def test_a_missing_topic_fails_at_once_naming_it(broker: TansuBroker, tmp_path: Path) -> None:
    p = Pipeline("no-topic", checkpoint={"storage": str(tmp_path / "chk")}, restart=FixedDelayRestart(attempts=3, delay=0))
    broker.create_topic("present")
    src = KafkaSource(broker.bootstrap, "present", format="json", schema=pa.schema([("id", pa.int64())]))
    p.source(src).sink(KafkaSink(broker.bootstrap, "no-such-topic"))
    with pytest.raises((ConfigError, JobFailedError)) as err:
        p.run(runtime="local", restore="none")
    assert "topic 'no-such-topic' does not exist" in str(err.value)
