"""Enrichment join (``Stream.join_latest``) and interval join (``Stream.interval_join``): output equal to a
pure-Python reference over the whole input, on both state backends; the table side's upserts, tombstones
and records before their dimension row; options checked in one line. (Crashes: test_faults.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from sluice import CheckpointConfig, ConfigError, GraphError, Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.operators.base import MAX_WATERMARK
from sluice.operators.joins import IntervalJoinOperator, LatestJoinOperator
from sluice.sinks.testing import read_committed

from tests.dedup_joins import data
from tests.dedup_joins.harness import Harness
from tests.dedup_joins.shapes import SHAPE
from tests.faults.shapes import BACKENDS, pipeline_of, rows_of


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize(("shape", "seed"), [("join_latest", 0), ("join_latest", 3), ("interval", 0), ("interval", 1)])
def test_joins_equal_the_reference(shape: str, seed: int, backend: str, tmp_path: Path) -> None:
    """Two sources at several parallelisms (seed 0: a left join, 3: an inner join): the committed rows are
    exactly the reference's."""
    p = pipeline_of(SHAPE[shape], seed, str(tmp_path), backend=backend)
    p.run(runtime="local", restore="none")
    got, expected = rows_of(read_committed(f"{tmp_path}/out")), p.reference()  # type: ignore[attr-defined]
    assert got == expected and len(expected) > 50


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


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_interval_join_subtask_without_rows_takes_the_final_watermark(backend: str) -> None:
    """A subtask that never held a row (none of its key groups had any, also after a restore of empty
    buffers, as on a rescale) passes the end-of-input watermark on instead of reading an absent time column;
    a restored subtask whose buffers then get rows still joins and releases them."""
    h = Harness(lambda: IntervalJoinOperator("interval", ["cust"], ["cust"], "ts", "ts", 5, 5), backend)
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
        (lambda: facts.interval_join(dims, on="cust", between=(1, -1)), "interval_join: between upper: must be a duration >= 0"),
        (lambda: facts.interval_join(dims, on="cust", between=5), "interval_join: between must be (lower, upper) durations"),
        (lambda: facts.interval_join(dims, on="cust", between=(0, 1), event_time="when"), "interval_join: event_time: column 'when'"),
    ]  # fmt: skip
    for build, message in cases:
        with pytest.raises(ConfigError) as err:
            build()
        assert message in str(err.value) and "\n" not in str(err.value), str(err.value)
    with pytest.raises(GraphError, match="the other stream must be a stream of the same pipeline"):
        facts.join_latest(_typed(other, "x", data.DIMS), on="cust")
