"""Unit tests of the Kafka connector: decoding, offsets, assignment, watermarks, options, reader positions."""

from __future__ import annotations

import base64
import collections
import json

import pyarrow as pa
import pytest
from pydantic import ValidationError
from sluice.connectors.kafka import KafkaDataLossError, KafkaSource, OffsetsInitializer
from sluice.connectors.kafka.formats.csv import CsvDecoder
from sluice.connectors.kafka.formats.json import JsonDecoder
from sluice.connectors.kafka.offsets import KafkaSplit, owner_of, parse_split_id, resolve_offsets, split_id
from sluice.connectors.kafka.reader import KafkaSourceReader
from sluice.connectors.kafka.watermarks import PartitionWatermarks
from sluice.errors import BadRecordError, ConfigError
from sluice.source import InputStatus, SourceSplit

from tests.connectors.kafka.fakes import (
    CollectingOutput,
    FakeConsumer,
    FakeMessage,
    FakeReaderContext,
    eof,
    out_of_range,
)

pytestmark = pytest.mark.kafka

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


# -- decoding ------------------------------------------------------------------------------------------
def test_json_batch_decodes_in_one_parse_and_keeps_inferred_schema_steady() -> None:
    d = JsonDecoder(None)
    r = d.decode([b'{"id": 1, "name": "a"}', b'{"id": 2, "name": "b"}'])
    assert r.batch is not None and r.batch.to_pydict() == {"id": [1, 2], "name": ["a", "b"]}
    assert r.rows is None and r.bad == []
    assert d.schema == r.batch.schema
    r2 = d.decode([b'{"id": 3, "extra": true}'])  # known fields keep their types; new ones are added
    assert r2.batch is not None and r2.batch.schema == d.schema
    assert r2.batch.to_pydict() == {"id": [3], "name": [None], "extra": [True]}
    assert d.schema.names == ["id", "name", "extra"]


def test_json_explicit_schema_ignores_unknown_fields() -> None:
    r = JsonDecoder(SCHEMA).decode([b'{"id": 1, "zzz": 5}', b'{"name": "x"}'])
    assert r.batch is not None and r.batch.to_pydict() == {"id": [1, None], "name": [None, "x"]}


def test_json_bad_records_are_located_and_good_ones_kept() -> None:
    values = [b'{"id": 1}', b"not json", b'{"id": "text"}', b'{"id": 4}', b'{"id": 5}{"id": 6}']
    r = JsonDecoder(SCHEMA).decode(values)
    assert r.batch is not None and r.batch.column("id").to_pylist() == [1, 4]
    assert list(r.rows) == [0, 3]  # type: ignore[arg-type]
    assert [i for i, _ in r.bad] == [1, 2, 4]
    assert all("Arrow" in e or "row" in e for _, e in r.bad)


def test_json_tombstones_are_skipped_and_counted() -> None:
    r = JsonDecoder(SCHEMA).decode([None, b'{"id": 7}', None, b"bad"])
    assert r.tombstones == 2
    assert r.batch is not None and r.batch.column("id").to_pylist() == [7]
    assert list(r.rows) == [1]  # type: ignore[arg-type]
    assert [i for i, _ in r.bad] == [3]


def test_json_value_with_embedded_newline_is_one_record() -> None:
    r = JsonDecoder(SCHEMA).decode([b'{"id":\n 1}', b'{"id": 2}'])
    assert r.bad == [] and r.batch is not None and r.batch.column("id").to_pylist() == [1, 2]


def test_csv_decoding_with_schema_and_bad_rows() -> None:
    r = CsvDecoder(SCHEMA).decode([b"1,a", b"2", b"x,b", b"4,d"])
    assert r.batch is not None and r.batch.to_pydict() == {"id": [1, 4], "name": ["a", "d"]}
    assert [i for i, _ in r.bad] == [1, 2]


def test_csv_without_schema_infers_columns() -> None:
    r = CsvDecoder(None, delimiter=";").decode([b"1;a", b"2;b"])
    assert r.batch is not None and r.batch.to_pydict() == {"f0": [1, 2], "f1": ["a", "b"]}


# -- offsets and assignment ----------------------------------------------------------------------------
class FakeLookup:
    def watermarks(self, tps):  # type: ignore[no-untyped-def]
        return {tp: (5, 50) for tp in tps}

    def committed(self, tps):  # type: ignore[no-untyped-def]
        return {tp: (20 if tp[1] == 0 else None) for tp in tps}

    def for_times(self, tps, timestamp_ms):  # type: ignore[no-untyped-def]
        return {tp: (30 if tp[1] == 0 else None) for tp in tps}


TPS = [("t", 0), ("t", 1)]


@pytest.mark.parametrize(
    ("init", "expected"),
    [
        (OffsetsInitializer.earliest(), {("t", 0): 5, ("t", 1): 5}),
        (OffsetsInitializer.latest(), {("t", 0): 50, ("t", 1): 50}),
        (OffsetsInitializer.committed(), {("t", 0): 20, ("t", 1): 5}),
        (OffsetsInitializer.committed(fallback="latest"), {("t", 0): 20, ("t", 1): 50}),
        (OffsetsInitializer.timestamp(1234), {("t", 0): 30, ("t", 1): 50}),
        (OffsetsInitializer.specific({("t", 1): 7}), {("t", 0): 5, ("t", 1): 7}),
        (OffsetsInitializer.specific({("t", 1): 7}, fallback="latest"), {("t", 0): 50, ("t", 1): 7}),
    ],
)
def test_resolve_offsets(init: OffsetsInitializer, expected: dict[tuple[str, int], int]) -> None:
    assert resolve_offsets(init, TPS, FakeLookup()) == expected


def test_offsets_initializer_coercion_and_errors() -> None:
    assert OffsetsInitializer.of("latest", "x").kind == "latest"
    assert OffsetsInitializer.of({("t", 0): 3}, "x").offsets == {("t", 0): 3}
    with pytest.raises(ConfigError, match="starting_offsets must be 'earliest', 'latest', 'committed'"):
        OffsetsInitializer.of("newest", "starting_offsets")
    with pytest.raises(ConfigError, match=r"stopping_offsets: offsets must map \(topic, partition\)"):
        OffsetsInitializer.of({("t", 0): -1}, "stopping_offsets")


def test_split_ids_round_trip() -> None:
    assert split_id("orders.v1", 12) == "orders.v1:12"
    assert parse_split_id("orders.v1:12") == ("orders.v1", 12)


def test_assignment_is_deterministic_and_balanced() -> None:
    owners = [owner_of("orders", p, 3) for p in range(12)]
    assert owners == [owner_of("orders", p, 3) for p in range(12)]
    assert collections.Counter(owners) == {0: 4, 1: 4, 2: 4}


# -- watermarks ----------------------------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_watermark_is_min_over_partitions_minus_bound() -> None:
    wm = PartitionWatermarks(bound_ms=100, idle_timeout_s=None)
    wm.add("a")
    wm.add("b")
    wm.update("a", 5_000)
    assert wm.current() is None  # b has no records yet: holds the watermark back
    wm.update("b", 3_000)
    wm.update("a", 4_000)  # out of order: max stays 5000
    assert wm.current() == 2_900
    wm.remove("b")
    assert wm.current() == 4_900


def test_idle_partition_is_left_out() -> None:
    clock = Clock()
    wm = PartitionWatermarks(bound_ms=0, idle_timeout_s=10, clock=clock)
    wm.add("a")
    wm.add("b")
    wm.update("a", 1_000)
    assert wm.current() is None
    clock.now = 11
    wm.update("a", 2_000)  # b never had records and is idle now
    assert wm.current() == 2_000
    assert not wm.all_idle()
    clock.now = 30  # everything idle: no watermark, and the reader marks itself idle downstream
    assert wm.current() is None and wm.all_idle()
    wm.update("b", 500)
    assert wm.current() == 500


# -- options -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"format": "xml"}, r"format must be one of \('raw', 'json', 'csv', 'avro', 'debezium-json', 'debezium-avro', 'upsert-json', 'upsert-avro'\)"),
        ({"on_bad_record": "skip"}, r"on_bad_record must be one of \('fail', 'dead_letter'\)"),
        ({"poll_timeout_ms": 500}, "poll_timeout_ms must be an integer in 0..50"),
        ({"batch_size": 0}, "batch_size must be an integer >= 1"),
        ({"topic_pattern": "x.*"}, "exactly one of topics"),
        ({"starting_offsets": "committed"}, "needs group_id"),
        ({"stopping_offsets": "committed"}, "stopping_offsets must be"),
        ({"consumer_config": {"enable.auto.commit": True}}, "must not set 'enable.auto.commit'"),
        ({"consumer_config": {"auto.offset.reset": "earliest"}}, "fail_on_data_loss"),
        ({"consumer_config": {"no.such.setting": 1}}, "consumer_config: .*no.such.setting"),
        ({"format": "raw", "schema": SCHEMA}, "apply to formats 'json', 'csv' and 'avro'"),
        ({"format": "avro"}, "format 'avro' needs schema_registry .* or avro_schema"),
        ({"format": "csv", "schema_registry": "http://r:8081"}, "schema_registry applies to format 'avro' or 'debezium-avro' or 'json'"),
        ({"format": "avro", "schema_registry": "ftp://r"}, r"schema_registry url must be http\(s\)://host"),
        ({"format": "avro", "avro_schema": '{"type": "recrod"}'}, "avro_schema: not a valid Avro schema"),
        (
            {"format": "avro", "avro_schema": {"type": "record", "name": "r", "fields": [{"name": "u", "type": ["int", "string"]}]}},
            r"avro_schema: .*u: a union of several non-null types",
        ),
        ({"format": "json", "avro_schema": '"string"'}, "avro_schema applies to format 'avro'"),
        ({"format": "json", "schema_sample_size": -1}, "schema_sample_size must be an integer >= 0"),
        ({"max_prefetch_bytes": 1000}, "max_prefetch_bytes must be an integer >= 4 MiB"),
        ({"fetch_thread": "yes"}, "fetch_thread must be True or False"),
        ({"idle_timeout_s": -1}, "KafkaSource: idle_timeout_s: must be a duration > 0"),
        ({"idle_timeout_s": "soon"}, "KafkaSource: idle_timeout_s: 'soon' is not a duration"),
    ],
)
def test_validate_names_the_option(kwargs: dict[str, object], message: str) -> None:
    src = KafkaSource("localhost:9092", "t", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=message):
        src.validate()


def test_secrets_never_shown() -> None:
    src = KafkaSource(
        "localhost:9092",
        "t",
        consumer_config={
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "me",
            "sasl.password": "hunter2-secret",
            "ssl.key.password": "k3y-pass",
        },
    )
    text = repr(src)
    assert "hunter2-secret" not in text and "k3y-pass" not in text and "***" in text and "SASL_SSL" in text
    src.validate()
    bad = KafkaSource(
        "localhost:9092", "t", consumer_config={"sasl.password": "hunter2-secret", "bogus.key": "x"}
    )
    with pytest.raises(ConfigError) as info:
        bad.validate()
    assert "hunter2-secret" not in str(info.value)


def test_options_are_checked_once_frozen_and_read_as_attributes() -> None:
    src = KafkaSource("localhost:9092", "t", format="json", consumer_config={"sasl.password": "hunter2-secret"})
    options = src.options
    assert src.options is options and options.topics == ["t"] and src.topics == ["t"] and src.format == "json"
    assert "hunter2-secret" not in repr(options) and "'sasl.password': '***'" in repr(options)
    with pytest.raises(ValidationError, match="frozen"):
        options.batch_size = 5  # type: ignore[misc]
    with pytest.raises(AttributeError):
        _ = src.no_such_option
    src.batch_size = 0  # an option assigned later is checked when the job is built
    with pytest.raises(ConfigError, match=r"batch_size must be an integer >= 1 \(got 0\)"):
        src.validate()
    src.batch_size, src.name = 500, "orders"
    assert src.options.batch_size == 500 and src.options.name == src.name == "orders"
    with pytest.raises(ConfigError, match=r"consumer_config must be a dict of librdkafka settings \(got 5\)"):
        KafkaSource("localhost:9092", "t", consumer_config=5).validate()  # type: ignore[arg-type]


# -- reader (fake consumer) ----------------------------------------------------------------------------
def make_reader(
    monkeypatch: pytest.MonkeyPatch, **kwargs: object
) -> tuple[KafkaSourceReader, FakeConsumer, FakeReaderContext]:
    consumers: list[FakeConsumer] = []

    def factory(conf: dict[str, object]) -> FakeConsumer:
        consumers.append(FakeConsumer(conf))
        return consumers[-1]

    monkeypatch.setattr(KafkaSourceReader, "consumer_factory", staticmethod(factory))
    src = KafkaSource("localhost:9092", "t", **{"format": "json", "schema": SCHEMA, "fetch_thread": False, **kwargs})  # type: ignore[arg-type]
    src.validate()
    ctx = FakeReaderContext()
    reader = KafkaSourceReader(src.options, ctx)
    reader.start()
    return reader, consumers[0], ctx


def rec(o: int, p: int = 0, ts: int = 1_700_000_000_000) -> FakeMessage:
    return FakeMessage("t", p, o, json.dumps({"id": o}).encode(), ts=ts)


def test_reader_configures_consumer_for_exactly_once(monkeypatch: pytest.MonkeyPatch) -> None:
    _, consumer, _ = make_reader(monkeypatch, stopping_offsets="latest")
    c = consumer.conf
    assert c["enable.auto.commit"] is False and c["auto.offset.reset"] == "error"
    assert c["isolation.level"] == "read_committed" and c["enable.partition.eof"] is True
    assert c["group.id"] == "sluice-job-kafka"


def test_position_is_last_offset_plus_one_across_gaps(monkeypatch: pytest.MonkeyPatch) -> None:
    reader, consumer, _ = make_reader(monkeypatch)
    reader.add_splits([SourceSplit("t:0", 10)])
    assert consumer.assigned == {("t", 0): 10}
    consumer.batches = [[rec(10), rec(11), rec(15)]]  # 12-14: transaction markers / compacted away
    out = CollectingOutput()
    assert reader.poll_next(out) is InputStatus.MORE_AVAILABLE
    assert out.batches[0].column("id").to_pylist() == [10, 11, 15]
    assert reader.snapshot_state(1) == [KafkaSplit("t:0", 16, None)]
    assert reader.poll_next(out) is InputStatus.NOTHING_AVAILABLE


def test_unbounded_position_moves_past_a_trailing_marker_at_partition_eof(monkeypatch: pytest.MonkeyPatch) -> None:
    """Transactional input ends with a commit marker, never delivered: the end of the partition moves the
    position past it (else the lag and the committed group offsets stay one behind per partition)."""
    reader, consumer, _ = make_reader(monkeypatch)
    assert consumer.conf["enable.partition.eof"] is True
    reader.add_splits([SourceSplit("t:0", 0)])
    consumer.batches = [[rec(0), rec(1), rec(2), eof("t", 0, 4)], [eof("t", 0, 2)]]  # 3: a commit marker
    out = CollectingOutput()
    reader.poll_next(out)
    assert reader.snapshot_state(1) == [KafkaSplit("t:0", 4, None)]
    reader.poll_next(out)  # an earlier end never moves a position back
    assert reader.snapshot_state(2) == [KafkaSplit("t:0", 4, None)]


def test_bounded_split_ends_at_stop_offset(monkeypatch: pytest.MonkeyPatch) -> None:
    reader, consumer, _ = make_reader(monkeypatch, stopping_offsets="latest")
    reader.add_splits([SourceSplit("t:0", 0, 3), SourceSplit("t:1", 5, 5)])  # t:1 is empty: done at once
    assert consumer.assigned == {("t", 0): 0}
    reader.notify_no_more_splits()
    consumer.batches = [[rec(0), rec(1), rec(2), rec(3), rec(4)]]
    out = CollectingOutput()
    reader.poll_next(out)
    assert out.batches[0].column("id").to_pylist() == [0, 1, 2]
    assert consumer.assigned == {}
    assert reader.poll_next(out) is InputStatus.END_OF_INPUT
    assert sorted(s.position for s in reader.snapshot_state(1)) == [3, 5]


def test_bounded_split_ends_at_partition_eof_when_stop_offset_is_a_marker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reader, consumer, _ = make_reader(monkeypatch, stopping_offsets="latest")
    reader.add_splits([SourceSplit("t:0", 0, 4)])  # offset 3 is a commit marker: never delivered
    reader.notify_no_more_splits()
    consumer.batches = [[rec(0), rec(1), rec(2)], [eof("t", 0, 3)], [eof("t", 0, 4)]]
    out = CollectingOutput()
    reader.poll_next(out)
    reader.poll_next(out)  # EOF below the stop offset: more may come
    assert reader.poll_next(out) is InputStatus.MORE_AVAILABLE
    assert reader.poll_next(out) is InputStatus.END_OF_INPUT
    assert reader.snapshot_state(1) == [KafkaSplit("t:0", 4, 4)]


def test_out_of_range_fails_naming_topic_partition_offset(monkeypatch: pytest.MonkeyPatch) -> None:
    reader, consumer, _ = make_reader(monkeypatch)
    reader.add_splits([SourceSplit("t:2", 1234)])
    consumer.batches = [[out_of_range("t", 2)]]
    with pytest.raises(
        KafkaDataLossError, match=r"offset 1234 of topic 't' partition 2 is out of range"
    ) as info:
        reader.poll_next(CollectingOutput())
    assert (info.value.topic, info.value.partition, info.value.offset) == ("t", 2, 1234)
    assert "fail_on_data_loss=False" in str(info.value)


def test_out_of_range_resets_to_earliest_when_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    reader, consumer, ctx = make_reader(monkeypatch, fail_on_data_loss=False)
    consumer.low = 700
    reader.add_splits([SourceSplit("t:0", 5)])
    consumer.batches = [[out_of_range("t", 0)]]
    reader.poll_next(CollectingOutput())
    assert consumer.assigned == {("t", 0): 700}
    assert ctx.metrics["data_loss_resets"] == 1
    assert reader.snapshot_state(1) == [KafkaSplit("t:0", 700, None)]


def test_bad_record_fail_mode_names_the_record(monkeypatch: pytest.MonkeyPatch) -> None:
    reader, consumer, ctx = make_reader(monkeypatch)
    reader.add_splits([SourceSplit("t:0", 0)])
    consumer.batches = [[rec(0), FakeMessage("t", 0, 1, b"{oops"), rec(2)]]
    with pytest.raises(BadRecordError, match=r"topic='t', partition=0, offset=1, record=b'\{oops'"):
        reader.poll_next(CollectingOutput())
    assert ctx.metrics["bad_records"] == 1


def test_bad_record_dead_letter_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    reader, consumer, ctx = make_reader(monkeypatch, on_bad_record="dead_letter")
    reader.add_splits([SourceSplit("t:0", 0)])
    consumer.batches = [[rec(0), FakeMessage("t", 0, 1, b"{oops", k=b"k1"), rec(2)]]
    out = CollectingOutput()
    reader.poll_next(out)
    assert out.batches[0].column("id").to_pylist() == [0, 2]
    dead = out.side["dead_letters"][0].to_pydict()
    assert dead["topic"] == ["t"] and dead["partition"] == [0] and dead["offset"] == [1]
    assert dead["key_text"] == ["k1"] and dead["value_text"] == ["{oops"] and "JSON" in dead["error"][0]
    assert dead["key_base64"] == [None] and dead["value_base64"] == [None] and dead["value_bytes"] == [5]
    assert ctx.metrics["bad_records"] == 1
    assert reader.snapshot_state(1) == [KafkaSplit("t:0", 3, None)]  # the bad record is consumed too


def test_dead_letters_carry_binary_values_as_base64_and_text_as_text(monkeypatch: pytest.MonkeyPatch) -> None:
    reader, consumer, _ = make_reader(monkeypatch, on_bad_record="dead_letter")
    reader.add_splits([SourceSplit("t:0", 0)])
    binary = b"\x00\xff\xfe{"
    wire = b"\x00\x00\x00\x00\x01{"  # valid UTF-8, but control characters: binary
    consumer.batches = [
        [
            FakeMessage("t", 0, 0, binary, k=b"\xc3("),
            FakeMessage("t", 0, 1, "{é".encode()),
            FakeMessage("t", 0, 2, wire),
        ]
    ]
    out = CollectingOutput()
    reader.poll_next(out)
    dead = out.side["dead_letters"][0].to_pydict()
    b64 = [base64.b64encode(binary).decode(), None, base64.b64encode(wire).decode()]
    assert dead["value_text"] == [None, "{é", None] and dead["value_base64"] == b64
    assert dead["key_text"] == [None] * 3 and dead["key_base64"] == [base64.b64encode(b"\xc3(").decode(), None, None]
    assert dead["value_bytes"] == [4, 3, 6]
    assert [t.timestamp() for t in dead["timestamp"]] == [1_700_000_000.0] * 3


def test_commit_uses_the_checkpoints_offsets(monkeypatch: pytest.MonkeyPatch) -> None:
    reader, consumer, _ = make_reader(monkeypatch)
    reader.add_splits([SourceSplit("t:0", 0)])
    consumer.batches = [[rec(0), rec(1)], [rec(2), rec(3)]]
    out = CollectingOutput()
    reader.poll_next(out)
    reader.snapshot_state(7)  # position 2
    reader.poll_next(out)  # position 4 now
    reader.notify_checkpoint_complete(7)
    assert consumer.commits == [{("t", 0): 2}]
    reader.notify_checkpoint_complete(7)  # nothing new
    assert consumer.commits == [{("t", 0): 2}]


def test_commit_can_be_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    reader, consumer, _ = make_reader(monkeypatch, commit_offsets_on_checkpoint=False)
    reader.add_splits([SourceSplit("t:0", 0)])
    consumer.batches = [[rec(0)]]
    reader.poll_next(CollectingOutput())
    reader.snapshot_state(1)
    reader.notify_checkpoint_complete(1)
    assert consumer.commits == []


def test_per_partition_watermarks_from_kafka_timestamps(monkeypatch: pytest.MonkeyPatch) -> None:
    reader, consumer, _ = make_reader(monkeypatch, event_time="kafka", max_out_of_orderness_ms=10)
    reader.add_splits([SourceSplit("t:0", 0), SourceSplit("t:1", 0)])
    consumer.batches = [[rec(0, 0, ts=1000), rec(1, 0, ts=1500)], [rec(0, 1, ts=1200)], [rec(2, 0, ts=1100)]]
    out = CollectingOutput()
    reader.poll_next(out)
    assert out.watermarks == []  # partition 1 has no records yet
    reader.poll_next(out)
    assert out.watermarks == [1190]
    reader.poll_next(out)
    assert out.watermarks == [1190]


def test_watermarks_from_a_column(monkeypatch: pytest.MonkeyPatch) -> None:
    schema = pa.schema([("id", pa.int64()), ("at", pa.timestamp("ms"))])
    reader, consumer, _ = make_reader(monkeypatch, schema=schema, event_time="at")
    reader.add_splits([SourceSplit("t:0", 0)])
    consumer.batches = [[FakeMessage("t", 0, 0, b'{"id": 1, "at": "2024-01-01 00:00:01"}')]]
    out = CollectingOutput()
    reader.poll_next(out)
    assert out.watermarks == [1_704_067_201_000]


def test_inferred_schema_travels_with_splits_and_checkpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    reader, consumer, _ = make_reader(monkeypatch, schema=None)
    sampled = pa.schema([("id", pa.int64()), ("v", pa.float64())])
    reader.add_splits([KafkaSplit("t:0", 0, value_schema=sampled)])  # the enumerator's sample
    consumer.batches = [[FakeMessage("t", 0, 0, b'{"id": 1, "v": 2, "new": "x"}')]]
    out = CollectingOutput()
    reader.poll_next(out)
    assert out.batches[0].schema == pa.schema([*sampled, ("new", pa.string())])  # v stays double
    (split,) = reader.snapshot_state(1)
    assert split.position == 1 and split.value_schema == out.batches[0].schema
