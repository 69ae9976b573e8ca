"""End to end: tansu + recorded schema registry -> KafkaSource (avro, json with registry, steady json) ->
pipeline -> TwoPhaseCommitTestSink; and the fetch thread under crashes and backpressure."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from sluice.api import Pipeline
from sluice.config import FixedDelayRestart, NoRestart
from sluice.connectors.kafka import KafkaSource, native_wire
from sluice.connectors.kafka.formats.avro_schema import AvroSchema
from sluice.connectors.kafka.formats.schemas import align
from sluice.connectors.kafka.reader import KafkaSourceReader
from sluice.errors import BadRecordError, JobFailedError
from sluice.sinks.testing import TwoPhaseCommitTestSink, read_committed
from sluice.testing.faults import FaultInjector

from tests.connectors.kafka.helpers import committed_ids
from tests.connectors.kafka.registry_server import RecordedSchemaRegistry, avro_wire, json_wire
from tests.connectors.kafka.test_formats_units import EVENT_V1, EVENT_V2, ORDER_V1, ORDER_V2, order
from tests.kafka_broker import TansuBroker

pytestmark = [pytest.mark.kafka, pytest.mark.usefixtures("kafka_reader"), pytest.mark.tansu(
    "format decoding: plain records produced before the job, read to explicit stops from the fetched end (high_watermark.py); no transactions, timestamp lookups, out-of-range positions or new partitions"
)]


def stops(broker: TansuBroker, topic: str) -> dict[tuple[str, int], int]:
    return {(topic, p): off for p, off in broker.end_offsets(topic).items()}


def pipeline(name: str, tmp_path: Path, parallelism: int = 2, restart: Any = None) -> Pipeline:
    return Pipeline(
        name,
        parallelism=parallelism,
        restart=restart or FixedDelayRestart(attempts=5, delay=0),
        checkpoint={"interval": 0.05, "storage": str(tmp_path / "chk")},
    )


def slow(batch: pa.RecordBatch) -> pa.RecordBatch:
    time.sleep(0.003)
    return batch


def aligned_to(target: pa.Schema, seen: list[pa.Schema]) -> Callable[[pa.RecordBatch], pa.RecordBatch]:
    """A map that records each batch's schema and aligns it to ``target`` (the test sink wants one schema)."""

    def fn(batch: pa.RecordBatch) -> pa.RecordBatch:
        seen.append(batch.schema)
        return align(batch, target)

    return fn


METADATA = [
    ("_key", pa.binary()),
    ("_topic", pa.string()),
    ("_partition", pa.int32()),
    ("_offset", pa.int64()),
    ("_timestamp", pa.timestamp("ms", tz="UTC")),
]


def test_avro_round_trips_through_the_registry(
    broker: TansuBroker, topic: Callable[..., str], registry: RecordedSchemaRegistry, tmp_path: Path, kafka_reader: str
) -> None:
    before = native_wire.RECORDS["native"]
    t = topic(2)
    i1 = registry.register("orders-value", ORDER_V1)
    i2 = registry.register("orders-value", ORDER_V2)
    for p in (0, 1):
        broker.produce(t, [avro_wire(i1, ORDER_V1, order(p * 1000 + i)) for i in range(300)], partition=p)
    broker.produce(t, [avro_wire(i2, ORDER_V2, order(5000 + i, currency="USD")) for i in range(100)], partition=0)
    broker.produce(t, [avro_wire(i1, ORDER_V1, order(6000 + i)) for i in range(50)], partition=0)
    v1 = pa.schema([*AvroSchema(ORDER_V1).logical, *METADATA])
    v2 = pa.schema([*AvroSchema(ORDER_V2).logical, *METADATA])
    seen: list[pa.Schema] = []
    p = pipeline("avro", tmp_path)
    p.source(
        KafkaSource(
            broker.bootstrap,
            t,
            format="avro",
            schema_registry=registry.url,
            include_metadata=True,
            batch_size=128,
            stopping_offsets=stops(broker, t),
        )
    ).map_batches(aligned_to(v2, seen)).sink(TwoPhaseCommitTestSink(str(tmp_path / "out")))
    p.run(runtime="local", restore="none")
    assert seen and all(s.equals(v1) or s.equals(v2) for s in seen) and any(s.equals(v2) for s in seen)
    out = read_committed(str(tmp_path / "out"))
    assert out is not None
    rows = {r["id"]: r for r in out.to_pylist()}
    expected = [*range(300), *range(1000, 1300), *range(5000, 5100), *range(6000, 6050)]
    assert sorted(rows) == expected
    r = rows[5007]
    assert (r["customer"], r["amount"], r["status"], r["note"], r["currency"]) == ("cust-5007-é", 5007.25, "NEW", None, "USD")
    assert r["placed_at"].timestamp() == 1_700_000_005.007 and r["_partition"] == 0
    assert rows[6001]["currency"] == "EUR"  # v1 records after v2 take v2's default
    assert registry.requests["GET /schemas/ids/1"] == 1 and registry.requests["GET /schemas/ids/2"] == 1
    # the native reader decoded batches itself (Python: the first ones, and the first with id 2)
    assert (native_wire.RECORDS["native"] > before) == (kafka_reader == "native")


def test_json_schema_round_trips_through_the_registry(
    broker: TansuBroker, topic: Callable[..., str], registry: RecordedSchemaRegistry, tmp_path: Path, kafka_reader: str
) -> None:
    before = native_wire.RECORDS["native"]
    t = topic(1)
    i4 = registry.register("events-value", EVENT_V1, "JSON")
    i5 = registry.register("events-value", EVENT_V2, "JSON")
    values = [json_wire(i4, {"id": i, "kind": "k", "score": i, "tags": ["a"]}) for i in range(200)]
    values += [json_wire(i5, {"id": 200 + i, "kind": "k", "score": i + 0.5, "source": "s"}) for i in range(200)]
    broker.produce(t, values, partition=0)
    target = pa.schema(
        [("id", pa.int64()), ("kind", pa.string()), ("score", pa.float64()), ("tags", pa.list_(pa.string())), ("source", pa.string())]
    )
    seen: list[pa.Schema] = []
    p = pipeline("json-sr", tmp_path, parallelism=1)
    p.source(
        KafkaSource(
            broker.bootstrap, t, format="json", schema_registry=registry.url, stopping_offsets=stops(broker, t),
            batch_size=50,
        )
    ).map_batches(aligned_to(target, seen)).sink(TwoPhaseCommitTestSink(str(tmp_path / "out")))
    p.run(runtime="local", restore="none")
    assert seen[-1].equals(target)
    out = read_committed(str(tmp_path / "out"))
    assert out is not None and committed_ids(out) == list(range(400))
    got = {r["id"]: r for r in out.to_pylist()}
    assert got[3]["score"] == 3 and got[3]["tags"] == ["a"] and got[250]["score"] == 50.5 and got[250]["source"] == "s"
    assert (native_wire.RECORDS["native"] > before) == (kafka_reader == "native")


def test_unknown_schema_id_reaches_dead_letters_with_its_position(
    broker: TansuBroker, topic: Callable[..., str], registry: RecordedSchemaRegistry, tmp_path: Path
) -> None:
    t = topic(2)
    i1 = registry.register("orders-value", ORDER_V1)
    bad: set[tuple[int, int]] = set()
    for part in (0, 1):
        values = []
        for i in range(200):
            if i % 41 == 7:
                values.append(avro_wire(i1, ORDER_V1, order(i))[:1] + (999).to_bytes(4, "big") + b"\x02\x04")
                bad.add((part, i))
            elif i % 41 == 19:
                values.append(b'{"not": "avro"}')
                bad.add((part, i))
            else:
                values.append(avro_wire(i1, ORDER_V1, order(part * 1000 + i)))
        broker.produce(t, values, partition=part)
    p = pipeline("unknown-id", tmp_path)
    stream = p.source(
        KafkaSource(
            broker.bootstrap,
            t,
            format="avro",
            schema_registry=registry.url,
            on_bad_record="dead_letter",
            batch_size=64,
            stopping_offsets=stops(broker, t),
        )
    )
    stream.sink(TwoPhaseCommitTestSink(str(tmp_path / "out")))
    stream.side_output("dead_letters").sink(TwoPhaseCommitTestSink(str(tmp_path / "dead"), name="dead"), name="dead")
    p.run(runtime="local", restore="none")
    dead = read_committed(str(tmp_path / "dead"))
    assert dead is not None
    rows = dead.to_pylist()
    assert sorted((r["partition"], r["offset"]) for r in rows) == sorted(bad)
    assert all(r["topic"] == t for r in rows)
    raw = [r["value_text"].encode() if r["value_text"] is not None else base64.b64decode(r["value_base64"]) for r in rows]
    by_kind = {v[:1]: r["error"] for v, r in zip(raw, rows, strict=True)}
    assert "unknown schema id 999" in by_kind[b"\x00"] and "not in the Confluent wire format" in by_kind[b"{"]
    assert len(committed_ids(read_committed(str(tmp_path / "out")))) == 400 - len(bad)


def test_unknown_schema_id_fails_naming_the_record(
    broker: TansuBroker, topic: Callable[..., str], registry: RecordedSchemaRegistry, tmp_path: Path
) -> None:
    t = topic(1)
    i1 = registry.register("orders-value", ORDER_V1)
    broker.produce(t, [avro_wire(i1, ORDER_V1, order(0)), b"\x00\x00\x00\x03\xe7\x02"], partition=0)
    p = pipeline("unknown-id-fail", tmp_path, parallelism=1, restart=NoRestart())
    p.source(
        KafkaSource(broker.bootstrap, t, format="avro", schema_registry=registry.url, stopping_offsets=stops(broker, t))
    ).sink(TwoPhaseCommitTestSink(str(tmp_path / "out")))
    with pytest.raises(JobFailedError) as info:
        p.run(runtime="local", restore="none")
    cause = info.value.__cause__
    assert isinstance(cause, BadRecordError) and (cause.topic, cause.partition, cause.offset) == (t, 0, 1)
    assert "unknown schema id 999" in str(cause)


# -- steady JSON schemas --------------------------------------------------------------------------------
def test_json_schema_is_inferred_once_across_partitions_and_widens(
    broker: TansuBroker, topic: Callable[..., str], tmp_path: Path
) -> None:
    t = topic(3)
    # partition 0 starts with ints; partition 2 has a double in its first records: the sample sees both
    broker.produce(t, [json.dumps({"id": i, "v": i}).encode() for i in range(300)], partition=0)
    broker.produce(t, [json.dumps({"id": 1000 + i, "v": None}).encode() for i in range(300)], partition=1)
    broker.produce(t, [json.dumps({"id": 2000 + i, "v": i + 0.5}).encode() for i in range(300)], partition=2)
    # after the sampled part: a new field, a null field gets a value, and one value that does not widen
    broker.produce(t, [json.dumps({"id": 3000 + i, "v": 1, "extra": "x"}).encode() for i in range(50)], partition=1)
    broker.produce(t, [b'{"id": 4000, "v": "oops"}'], partition=1)
    p = pipeline("steady-json", tmp_path, parallelism=2)
    stream = p.source(
        KafkaSource(
            broker.bootstrap,
            t,
            format="json",
            schema_sample_size=100,
            batch_size=50,
            on_bad_record="dead_letter",
            stopping_offsets=stops(broker, t),
        )
    )
    target = pa.schema([("id", pa.int64()), ("v", pa.float64()), ("extra", pa.string())])
    seen: list[pa.Schema] = []
    stream.map_batches(aligned_to(target, seen)).sink(TwoPhaseCommitTestSink(str(tmp_path / "out")))
    stream.side_output("dead_letters").sink(TwoPhaseCommitTestSink(str(tmp_path / "dead"), name="dead"), name="dead")
    p.run(runtime="local", restore="none")
    out = read_committed(str(tmp_path / "out"))
    assert out is not None and len(committed_ids(out)) == 950
    assert all(s.field("v").type == pa.float64() for s in seen)  # from the very first batch of every reader
    assert seen[-1].equals(target) or any(s.equals(target) for s in seen)
    dead = read_committed(str(tmp_path / "dead"))
    assert dead is not None
    (row,) = dead.to_pylist()
    assert (row["topic"], row["partition"], row["offset"]) == (t, 1, 350)
    assert row["error"].startswith("field 'v' changed type from double to string")


def test_steady_json_incompatibility_fails_naming_field_types_and_position(
    broker: TansuBroker, topic: Callable[..., str], tmp_path: Path
) -> None:
    t = topic(1)
    broker.produce(t, [b'{"id": 1, "n": 1}', b'{"id": 2, "n": 1.5}', b'{"id": 3, "n": [1]}'], partition=0)
    p = pipeline("steady-fail", tmp_path, parallelism=1, restart=NoRestart())
    p.source(KafkaSource(broker.bootstrap, t, format="json", stopping_offsets=stops(broker, t))).sink(
        TwoPhaseCommitTestSink(str(tmp_path / "out"))
    )
    with pytest.raises(JobFailedError) as info:
        p.run(runtime="local", restore="none")
    cause = info.value.__cause__
    assert isinstance(cause, BadRecordError) and (cause.topic, cause.partition, cause.offset) == (t, 0, 2)
    assert "field 'n' changed type from double to list<item: int64>" in str(cause)


# -- the fetch thread -----------------------------------------------------------------------------------
class CrashWhileAhead(FaultInjector):
    """Crashes at the n-th emitted batch, once the fetch thread has read ahead of the task."""

    readers: list[KafkaSourceReader]
    ahead: list[int]

    def hit(self, point: str, where: str = "") -> None:
        if point == self.point and self._hits + 1 > self.after and not self.fired:
            deadline = time.monotonic() + 30  # a bound, not a timing assumption: the thread fills its queue
            while not any(r.prefetched_records for r in self.readers) and time.monotonic() < deadline:
                time.sleep(0.01)
            self.ahead.append(sum(r.prefetched_records for r in self.readers))
        super().hit(point, where)


@pytest.mark.faults
def test_crash_while_the_fetch_thread_is_ahead_is_exactly_once(
    broker: TansuBroker, topic: Callable[..., str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = topic(2)
    ids = list(range(4000))
    for part in (0, 1):
        broker.produce(t, [json.dumps({"id": i}).encode() for i in ids[part::2]], partition=part)
    readers: list[KafkaSourceReader] = []
    start = KafkaSourceReader.start

    def recording_start(self: KafkaSourceReader) -> None:
        readers.append(self)
        start(self)

    monkeypatch.setattr(KafkaSourceReader, "start", recording_start)
    faults = CrashWhileAhead(point="source", after=15)
    faults.readers, faults.ahead = readers, []
    p = pipeline("fetch-ahead", tmp_path)
    p.source(
        KafkaSource(
            broker.bootstrap,
            t,
            format="json",
            schema=pa.schema([("id", pa.int64())]),
            batch_size=50,
            stopping_offsets=stops(broker, t),
        )
    ).map_batches(slow).sink(TwoPhaseCommitTestSink(str(tmp_path / "out")))
    result = p.run(runtime="local", faults=faults, restore="none")
    assert faults.fired and result.attempts >= 2
    assert faults.ahead and faults.ahead[0] > 0, "the crash hit while fetched records were not emitted yet"
    assert committed_ids(read_committed(str(tmp_path / "out"))) == ids


def test_slow_sink_stops_the_fetching_within_the_budget(
    broker: TansuBroker, topic: Callable[..., str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = topic(1)
    value = json.dumps({"id": 0, "pad": "x" * 8000}).encode()
    broker.produce(t, [value] * 3000, partition=0)  # 24 MB, six times the budget below
    readers: list[KafkaSourceReader] = []
    start = KafkaSourceReader.start

    def recording_start(self: KafkaSourceReader) -> None:
        readers.append(self)
        start(self)

    monkeypatch.setattr(KafkaSourceReader, "start", recording_start)
    gate = threading.Event()
    seen: list[int] = []

    def blocked(batch: pa.RecordBatch) -> pa.RecordBatch:
        seen.append(batch.num_rows)
        gate.wait(60)
        return batch

    budget = 4 * 1024 * 1024
    p = pipeline("budget", tmp_path, parallelism=1)
    p.source(
        KafkaSource(
            broker.bootstrap, t, format="json", batch_size=100, max_prefetch_bytes=budget, stopping_offsets=stops(broker, t)
        )
    ).map_batches(blocked).sink(TwoPhaseCommitTestSink(str(tmp_path / "out")))
    client = p.start(runtime="local", restore="none")
    try:
        deadline = time.monotonic() + 60
        while not (
            seen and readers and readers[0]._fetcher is not None and readers[0]._fetcher.queued_bytes >= budget // 2
        ):  # the task is blocked in the sink with its first batch, and the fetch thread has filled its half
            assert time.monotonic() < deadline, "the fetch thread never filled its half of the budget"
            time.sleep(0.02)
        fetcher = readers[0]._fetcher
        conf = readers[0]._consumer_conf
        assert conf["queued.max.messages.kbytes"] == budget // 2 // 1024 and conf["fetch.max.bytes"] <= budget // 2
        before = fetcher.fetched_records
        time.sleep(0.5)  # the task is blocked in the sink: nothing may be fetched meanwhile
        assert fetcher.fetched_records == before
        assert fetcher.queued_bytes <= budget // 2 + 100 * len(value)
    finally:
        gate.set()
    client.wait()
    assert len(committed_ids(read_committed(str(tmp_path / "out")))) == 3000
