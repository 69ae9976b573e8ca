"""Every serializer of the built-in connectors round-trips what they checkpoint, as JSON (issue 22), and the
SPI defaults and helpers behave as documented."""

from __future__ import annotations

import datetime
import decimal
import json
import pickle
from typing import Any

import pyarrow as pa
import pytest
from sluice.connectors.generator import GeneratorSource
from sluice.connectors.kafka import KafkaSource
from sluice.connectors.kafka.offsets import KafkaSplit
from sluice.serializers import (
    JsonSerializer,
    PickleSerializer,
    SimpleVersionedSerializer,
    SourceSplitSerializer,
    schema_from_text,
    schema_to_text,
)
from sluice.sink import Sink
from sluice.sinks.delta import DeltaSink
from sluice.sinks.files import FileCommittable, FileSink
from sluice.sinks.iceberg import IcebergSink
from sluice.sinks.tables import TableFile
from sluice.sinks.testing import TwoPhaseCommitTestSink
from sluice.source import Source, SourceSplit

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string())], metadata={b"k": b"v"})


def trip(serializer: SimpleVersionedSerializer[Any], value: Any) -> Any:
    data = serializer.serialize(value)
    assert isinstance(data, bytes)
    if not isinstance(serializer, PickleSerializer):
        json.loads(data)  # JSON, nothing else (a pickle starts with 0x80 and is not)
    return serializer.deserialize(serializer.version, data)


def kafka() -> KafkaSource:
    return KafkaSource("localhost:9092", "t", format="json", schema=SCHEMA)


@pytest.mark.parametrize(
    "split",
    [
        KafkaSplit("t:0", 17, 42, value_schema=SCHEMA),
        KafkaSplit("my.topic:11", 0, None, value_schema=None),
        KafkaSplit("t:1", None, None),
    ],
)
def test_kafka_splits(split: KafkaSplit) -> None:
    back = trip(kafka().split_serializer(), split)
    assert type(back) is KafkaSplit and back == split
    assert (back.value_schema is None) == (split.value_schema is None)
    if split.value_schema is not None:
        assert back.value_schema.equals(split.value_schema, check_metadata=True)


def test_kafka_enumerator_state() -> None:
    state = {"pending": [KafkaSplit("t:2", 5, 9, value_schema=SCHEMA)], "discovered": ["t:0", "t:1", "t:2"], "schema": SCHEMA}
    back = trip(kafka().enumerator_state_serializer(), state)
    assert back["pending"] == state["pending"] and back["discovered"] == state["discovered"]
    assert back["schema"].equals(SCHEMA, check_metadata=True)
    assert trip(kafka().enumerator_state_serializer(), {**state, "schema": None})["schema"] is None


def test_kafka_splits_refuse_non_integer_offsets() -> None:
    with pytest.raises(TypeError, match="must be an integer offset"):
        kafka().split_serializer().serialize(KafkaSplit("t:0", "17", None))


def test_generator_splits_and_enumerator_state() -> None:
    src = GeneratorSource(num_splits=2, records_per_split=10)
    splits = [SourceSplit("0", 3, 10), SourceSplit("1", 0, None)]
    assert [trip(src.split_serializer(), s) for s in splits] == splits
    assert trip(src.enumerator_state_serializer(), splits) == splits


def test_plain_split_positions() -> None:
    split = SourceSplit("f", {"offsets": (1, 2), "when": datetime.date(2024, 1, 2)}, [b"\x00", None])
    assert trip(SourceSplitSerializer(), split) == split
    with pytest.raises(TypeError, match="SourceSplitSerializer writes SourceSplit"):
        SourceSplitSerializer().serialize(KafkaSplit("t:0", 1, 2))


def test_file_sink_committables_and_writer_state(tmp_path: Any) -> None:
    sink = FileSink(str(tmp_path), format="parquet")
    c = FileCommittable(
        "b=1", "b=1/part-x.parquet", "b=1/.part-x.parquet.a0.pending", 1024, 10, 3, "abc123",
        upload_id="up-1", parts=((1, "etag-1"), (2, "etag-2")), held=True, replaces=("old-1", "old-2"),
    )
    assert trip(sink.committable_serializer(), c) == c
    state = {"held": [c, FileCommittable("", "part-y", ".part-y.a1.pending", 1, 1, 4, "f")], "held_age": {"b=1": 2, "": 1}}
    assert trip(sink.writer_state_serializer(), state) == state


def _table_file(stats: Any, partition: tuple[tuple[str, Any], ...]) -> TableFile:
    return TableFile(
        "p=1/part-j-00000003-000-a0-000.parquet", 2048, 7, partition, "p=1", 3, SCHEMA, stats,
        pa.schema([("p", pa.int64())]),
    )


@pytest.mark.parametrize(
    ("sink", "stats", "partition"),
    [
        (DeltaSink("/tmp/t"), '{"numRecords":7,"minValues":{"id":1}}', (("p", "1"), ("q", None))),
        (
            IcebergSink("db.t", catalog_properties={"uri": "sqlite:///:memory:"}),
            {
                "spec_id": 0, "record_count": 7, "column_sizes": {1: 100, 2: 80}, "value_counts": {1: 7},
                "null_value_counts": {2: 0}, "nan_value_counts": {}, "lower_bounds": {1: b"\x01\x00\x00\x00"},
                "upper_bounds": {1: b"\x07\x00\x00\x00"}, "split_offsets": [4],
            },
            (("p", 1), ("t_day", 19723), ("d", datetime.date(2024, 1, 1)), ("x", decimal.Decimal("1.50"))),
        ),
    ],
    ids=["delta", "iceberg"],
)
def test_table_files(sink: Sink[Any], stats: Any, partition: tuple[tuple[str, Any], ...]) -> None:
    f = _table_file(stats, partition)
    back = trip(sink.committable_serializer(), f)
    assert back.stats == f.stats and back.partition == f.partition and back.path == f.path
    assert back.schema.equals(SCHEMA, check_metadata=True) and back.partition_schema.equals(f.partition_schema)
    assert (back.size, back.rows, back.checkpoint_id, back.partition_path) == (2048, 7, 3, "p=1")


def test_test_sink_committables(tmp_path: Any) -> None:
    assert trip(TwoPhaseCommitTestSink(str(tmp_path)).committable_serializer(), "job-0001.arrow") == "job-0001.arrow"


def test_the_defaults_pickle() -> None:
    class Custom(Source):  # a user connector that names no serializer
        boundedness = None  # type: ignore[assignment]

        def create_enumerator(self, ctx: Any, restored: Any) -> Any: ...
        def create_reader(self, ctx: Any) -> Any: ...

    ser = Custom().split_serializer()
    assert isinstance(ser, PickleSerializer) and ser.version == 1
    assert isinstance(Custom().enumerator_state_serializer(), PickleSerializer)
    assert trip(ser, SourceSplit("a", {1, 2})) == SourceSplit("a", {1, 2})
    assert ser.serialize([1]) == pickle.dumps([1], protocol=5)
    with pytest.raises(ValueError, match="reads version 1, not 2"):
        ser.deserialize(2, ser.serialize(1))


def test_json_serializers_refuse_versions_they_never_wrote() -> None:
    class V2(JsonSerializer[int]):
        VERSION = 2

        def to_json(self, obj: int) -> Any:
            return obj

        def from_json(self, version: int, value: Any) -> int:
            return int(value) * (10 if version == 1 else 1)

    assert V2().deserialize(1, b"4") == 40 and V2().deserialize(2, b"4") == 4
    with pytest.raises(ValueError, match=r"reads versions 1\.\.2, not 3"):
        V2().deserialize(3, b"4")
    with pytest.raises(ValueError):
        V2().serialize(float("nan"))  # type: ignore[arg-type]


def test_schemas_as_text() -> None:
    assert schema_from_text(schema_to_text(SCHEMA)).equals(SCHEMA, check_metadata=True)  # type: ignore[union-attr]
    assert schema_to_text(None) is None and schema_from_text(None) is None
