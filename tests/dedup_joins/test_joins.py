"""Enrichment join (``Stream.join_latest``) and interval join (``Stream.interval_join``): output equal to a
pure-Python reference over the whole input, on both state backends; the table side's upserts, tombstones
and records before their dimension row; options checked in one line. (Crashes: test_faults.py.)"""

from __future__ import annotations

import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from sluice import CheckpointConfig, ConfigError, GraphError, Pipeline, RestoreError
from sluice.connectors.generator import GeneratorSource
from sluice.operators.base import MAX_WATERMARK
from sluice.operators.joins import IntervalJoinOperator, LatestJoinOperator
from sluice.operators.joins.rows import RowCodec, decode_rows
from sluice.sinks.testing import TwoPhaseCommitTestSink, read_committed
from sluice.source import InputStatus, ReaderContext, ReaderOutput, SourceReader
from sluice.state.api import ValueStateDescriptor

from tests.dedup_joins import data
from tests.dedup_joins.harness import Harness
from tests.dedup_joins.shapes import SHAPE
from tests.faults.shapes import BACKENDS, _LingeringReader, pipeline_of, rows_of


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize(("shape", "seed"), [("join_latest", 0), ("join_latest", 3), ("interval", 0), ("interval", 1)])
def test_joins_equal_the_reference(shape: str, seed: int, backend: str, tmp_path: Path) -> None:
    """Two sources at several parallelisms (seed 0: a left join, 3: an inner join): the committed rows are
    exactly the reference's."""
    p = pipeline_of(SHAPE[shape], seed, str(tmp_path), backend=backend)
    p.run(runtime="local", restore="none")
    got, expected = rows_of(read_committed(f"{tmp_path}/out")), p.reference()  # type: ignore[attr-defined]
    assert got == expected and len(expected) > 50


class _Open(GeneratorSource):
    """A generator whose readers never end their input: a table topic nobody writes to any more."""

    def create_reader(self, ctx: ReaderContext) -> SourceReader:
        return _OpenReader(super().create_reader(ctx))


class _OpenReader(_LingeringReader):
    def poll_next(self, output: ReaderOutput) -> InputStatus:
        status = self.inner.poll_next(output)
        return InputStatus.NOTHING_AVAILABLE if status is InputStatus.END_OF_INPUT else status


def test_event_time_join_latest_goes_on_while_the_table_side_is_quiet(tmp_path: Path) -> None:
    """docs/dedup_joins.md's event-time enrichment with the default settings: the table's source has read
    its rows and stays open with nothing new (a quiet compacted topic), which holds its watermark back. Once
    it has been quiet for ``table_idle_timeout`` (5 s by default) it stops holding the join's watermark back
    and every record is joined, as the reference joins them (the table rows all arrived before). Before, the
    join wrote nothing while the table was quiet (``idle_timeout_s`` on the table's source was needed)."""
    f_rows, d_rows = data.facts(300, 7), data.dims(1, 7)
    p = Pipeline("quiet-table", checkpoint=CheckpointConfig(interval=0.1, storage=f"{tmp_path}/chk"))
    facts = p.source(GeneratorSource(num_splits=1, records_per_split=300, rows=f_rows, name="facts"))
    # every table row in one batch: the table side's idle clock starts with all of them delivered
    dims = p.source(_Open(num_splits=1, records_per_split=60, batch_size=60, rows=d_rows, name="dims"))
    facts = facts.map_batches(lambda b: b, schema=data.FACTS, name="typed-facts")
    dims = dims.map_batches(lambda b: b, schema=data.DIMS, name="typed-dims")
    out = f"{tmp_path}/out"
    facts.join_latest(dims, on="cust", how="left", event_time="ts").sink(TwoPhaseCommitTestSink(out))
    expected = data.as_rows(data.latest_reference(data.table_rows(f_rows, 1, 300), data.table_rows(d_rows, 1, 60), "left"))
    client = p.start(runtime="local", restore="none", control_endpoint=None)

    def committed() -> int:
        table = read_committed(out)
        return 0 if table is None else table.num_rows

    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and committed() < len(expected):
            assert client.running, client.wait()
            time.sleep(0.2)
        got = rows_of(read_committed(out)) if committed() else []
    finally:
        client.cancel()
    assert len(expected) > 100 and got == expected


def _dims(rows: list[tuple[int, str | None, int | None]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [{"cust": c, "ts": 0, "tier": t, "level": lv} for c, t, lv in rows], schema=data.DIMS
    ).drop_columns(["ts"])


def _facts(ids: list[int], custs: list[int]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"id": ids, "cust": custs})


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("how", ["inner", "left"])
def test_processing_time_join_upserts_deletes_and_survives_a_restore(backend: str, how: str) -> None:
    """Kafka Streams' KStream-KTable join: a record joins the table as it is when processed; a later row of
    its key replaces the earlier one, a tombstone deletes it; a record before its key's first row is dropped
    (inner) or kept with nulls (left); the table is in keyed state, restored after a restart."""
    schema = _dims([]).schema
    h = Harness(lambda: LatestJoinOperator("join", ["cust"], ["cust"], how, right_schema=schema), backend)  # type: ignore[arg-type]
    h.op.process_batch(_facts([1], [7]), 0)  # before any table row
    h.op.process_batch(_dims([(7, "gold", 1), (8, "silver", 2), (7, "platinum", 3)]), 1)
    before = h.out.rows()
    h.restart()
    h.op.process_batch(_facts([2, 3, 4], [7, 8, 9]), 0)
    h.op.process_batch(_dims([(8, None, None)]), 1)  # a tombstone
    h.op.process_batch(_facts([5], [8]), 0)
    got = {r["id"]: (r["tier"], r["level"]) for r in before + h.out.rows()}
    joined = {2: ("platinum", 3), 3: ("silver", 2)}
    nulls = {1: (None, None), 4: (None, None), 5: (None, None)}
    assert got == (joined if how == "inner" else {**joined, **nulls})
    h.op.close()


def test_table_rows_round_trip_every_column_type() -> None:
    """The table row codec (one binary value per key) gives back every column type, nulls included, of a
    sliced batch; a null value (a key without a row) gives a row of nulls."""
    rows = pa.table({
        "i8": pa.array([1, None, -3, 4], pa.int8()), "u64": pa.array([2**64 - 1, 0, None, 7], pa.uint64()),
        "f": [0.5, None, float("inf"), -2.0], "b": [True, None, False, True],
        "ts": pa.array([1, 2, None, 4], pa.timestamp("us", "UTC")), "d": pa.array([0, 1, 2, None], pa.date32()),
        "dec": pa.array([Decimal("1.25"), None, Decimal("-3"), Decimal("4.5")], pa.decimal128(12, 2)),
        "fsb": pa.array([b"abc", b"def", None, b"ghi"], pa.binary(3)),
        "s": ["x", None, "", "\u00e9t\u00e9"], "ls": pa.array([None, "a" * 300, "b", "c"], pa.large_string()),
        "bin": [b"\x00\x01", b"", None, b"z"], "lst": [[1, 2], None, [], [3]],
        "st": [{"a": 1, "b": "q"}, None, {"a": None, "b": "r"}, {"a": 4, "b": None}], "none": pa.nulls(4),
    }).slice(1)  # fmt: skip
    codec = RowCodec(rows.schema)
    values = codec.encode(rows)
    assert values.type == pa.large_binary() and len(values) == 3
    with_gap = pa.concat_arrays([values.slice(0, 1), pa.nulls(1, pa.large_binary()), values.slice(1)])
    got = pa.table(decode_rows(with_gap.cast(pa.binary()), {codec.id: codec}, codec, "join"), schema=codec.schema)
    expected = rows.to_pylist()
    assert got.to_pylist() == [expected[0], dict.fromkeys(rows.column_names), *expected[1:]]


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_table_schema_change_is_read_by_column_name_after_a_restore(backend: str) -> None:
    """Table rows in state written with an earlier schema are read by name: a dropped column is gone, an
    added one null, a changed type cast; new rows use the new schema; a type that cannot be cast is one
    line naming the operator and the column."""
    old = pa.schema([("cust", pa.int64()), ("tier", pa.string()), ("level", pa.int32()), ("gone", pa.int64())])
    new = pa.schema([("cust", pa.int64()), ("tier", pa.string()), ("level", pa.int64()), ("added", pa.bool_())])
    schema = [old]
    h = Harness(lambda: LatestJoinOperator("join", ["cust"], ["cust"], "left", right_schema=schema[0]), backend)
    h.op.process_batch(pa.RecordBatch.from_pydict({"cust": [7, 8], "tier": ["gold", "silver"], "level": [1, None], "gone": [5, 6]}, schema=old), 1)
    schema[0] = new
    h.restart()
    h.op.process_batch(pa.RecordBatch.from_pydict({"cust": [8], "tier": ["bronze"], "level": [2], "added": [True]}, schema=new), 1)
    h.op.process_batch(_facts([1, 2, 3], [7, 8, 9]), 0)
    assert h.out.rows() == [
        {"id": 1, "cust": 7, "tier": "gold", "level": 1, "added": None},
        {"id": 2, "cust": 8, "tier": "bronze", "level": 2, "added": True},
        {"id": 3, "cust": 9, "tier": None, "level": None, "added": None},
    ]
    schema[0] = pa.schema([("cust", pa.int64()), ("tier", pa.list_(pa.int64()))])
    h.restart()
    with pytest.raises(ConfigError) as err:
        h.op.process_batch(_facts([4], [7]), 0)
    assert "join_latest 'join': table column 'tier' was string in state and is list<item: int64> now" in str(err.value)
    assert "\n" not in str(err.value)
    h.op.close()


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_checkpoint_of_the_earlier_state_layout_is_refused_in_one_line(backend: str) -> None:
    """A checkpoint whose table is in the layout of an earlier sluice (a value state per column and a
    version) is refused on restore with one line naming the operator (docs/dedup_joins.md)."""
    h = Harness(lambda: LatestJoinOperator("join", ["cust"], ["cust"], "left", right_schema=_dims([]).schema), backend)
    version = h.op.backend.batch_state(ValueStateDescriptor("version", serializer="int64"))
    version.put(h.op.backend.key_batch([pa.array([7])]), pa.array([0]))
    with pytest.raises(RestoreError) as err:
        h.restart()
    assert "join_latest 'join': the checkpoint holds the table in the layout of an earlier sluice" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_interval_join_subtask_without_rows_takes_the_final_watermark(backend: str) -> None:
    """A subtask that never held a row (none of its key groups had any, also after a restore of empty
    buffers, as on a rescale) passes the end-of-input watermark on instead of reading an absent time column;
    a restored subtask whose buffers then get rows still joins and releases them."""
    h = Harness(lambda: IntervalJoinOperator("interval", ["cust"], ["cust"], "ts", "ts", -5, 5), backend)
    h.op.process_watermark(MAX_WATERMARK)
    assert h.out.watermarks == [MAX_WATERMARK] and h.out.rows() == []
    h.restart()  # both buffers empty in the snapshot
    h.op.process_watermark(MAX_WATERMARK)
    assert h.out.watermarks == [MAX_WATERMARK]
    h.restart()
    h.op.process_batch(pa.RecordBatch.from_pydict({"id": [1], "cust": [7], "ts": [100]}), 0)
    h.op.process_batch(pa.RecordBatch.from_pydict({"cust": [7, 7], "ts": [103, 200], "v": [1, 2]}), 1)
    h.op.process_watermark(MAX_WATERMARK)
    assert h.out.rows() == [{"id": 1, "cust": 7, "ts": 100, "ts_right": 103, "v": 1}]
    assert h.out.watermarks == [MAX_WATERMARK] and not len(h.op.buffers[0]) and not len(h.op.buffers[1])
    h.op.close()


def _typed(p: Pipeline, name: str, schema: pa.Schema) -> Any:
    return p.source(GeneratorSource(num_splits=1, records_per_split=10, name=name)).map_batches(
        lambda b: b, schema=schema, name=f"typed-{name}"
    )


def test_options_are_checked_when_the_job_is_built(tmp_path: Path) -> None:
    p = Pipeline("join-options", checkpoint=CheckpointConfig(storage=f"{tmp_path}/chk"))
    facts, dims = _typed(p, "facts", data.FACTS), _typed(p, "dims", data.DIMS)
    untyped = p.source(GeneratorSource(num_splits=1, records_per_split=10, rows=data.facts(10, 3), name="raw"))
    other = Pipeline("other", checkpoint=CheckpointConfig(storage=f"{tmp_path}/chk"))
    cases: list[tuple[Any, str]] = [
        (lambda: facts.join_latest(dims, on="cust", how="outer"), "join_latest: how: 'outer' is not allowed (allowed: 'inner', 'left')"),
        (lambda: facts.join_latest(dims), "join_latest: name the key columns with on="),
        (lambda: facts.join_latest(dims, on="id"), "join_latest: right key: column 'id' is not in the stream"),
        (lambda: facts.join_latest(dims, left_on="id", right_on="tier"), "key columns 'id' (int64) and 'tier' (string) must have the same type"),
        (lambda: facts.join_latest(untyped, on="cust", how="left"), "join_latest: how='left' needs the table stream's schema"),
        (lambda: facts.interval_join(dims, on="cust", between=(1, -1)), "interval_join: between: lower 1 is after upper -1"),
        (lambda: facts.interval_join(dims, on="cust", between=5), "interval_join: between: expected (lower, upper)"),
        (lambda: facts.interval_join(dims, on="cust", between=("1 minute", "soon")), "interval_join: between upper: 'soon' is not a duration: give a number of seconds, a timedelta, or a number with a unit"),
        (lambda: facts.interval_join(dims, on="cust", between=(0, 1), event_time="when"), "interval_join: event_time: column 'when'"),
    ]  # fmt: skip
    for build, message in cases:
        with pytest.raises(ConfigError) as err:
            build()
        assert message in str(err.value) and "\n" not in str(err.value), str(err.value)
    with pytest.raises(GraphError, match="the other stream must be a stream of the same pipeline"):
        facts.join_latest(_typed(other, "x", data.DIMS), on="cust")
