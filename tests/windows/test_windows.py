"""Windowed aggregation: results equal DuckDB's over the whole input on both state backends (tumbling,
sliding, session windows; every built-in aggregation and a user one; keys of two columns); late records,
allowed lateness and its updates, session merging, processing time, and options refused in one line."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from sluice import CheckpointConfig, ConfigError, NoRestart, Pipeline
from sluice.connectors.generator import GeneratorSource, default_rows
from sluice.sinks.testing import TwoPhaseCommitTestSink, read_committed
from sluice.windows import (
    Session,
    Sliding,
    Tumbling,
    agg,
    count,
    count_distinct,
    first,
    last,
    max,
    mean,
    min,
    sum,
)

from tests.faults.shapes import BACKENDS
from tests.windows.helpers import batch, operator, sql

AGGS = (
    count(), sum("value"), max("value"), min("value"), mean("value"), first("id"), last("id"),
    count_distinct("value"), agg(lambda a: pc.sum(a).as_py(), "value", name="udf_sum", type=pa.int64()),
)  # fmt: skip
ASSIGNERS = {"tumbling": Tumbling(0.5), "sliding": Sliding("600ms", "200ms"), "session": Session("150 ms")}
#: per assigner: the input with each row's window bounds (ws, we), in DuckDB
WINDOWED = {
    "tumbling": "select *, t - t % 500 as ws, t - t % 500 + 500 as we from x",
    "sliding": "select *, t - t % 200 - j * 200 as ws, t - t % 200 - j * 200 + 600 as we "
    "from x, (values (0), (1), (2)) as r(j)",
    "session": """
        with marked as (
            select *, case when t - lag(t) over (partition by split, key order by t) <= 150 then 0 else 1 end as new
            from x),
        numbered as (
            select *, sum(new) over (partition by split, key order by t rows unbounded preceding) as sid from marked)
        select *, min(t) over (partition by split, key, sid) as ws, max(t) over (partition by split, key, sid) + 150 as we
        from numbered""",
}


def with_gaps(b: pa.RecordBatch) -> pa.RecordBatch:
    """``t``: the event time with a 700 ms pause after every 50 rows of a split (sessions end there)."""
    return b.append_column("t", pc.add(b.column("ts"), pc.multiply(pc.divide(b.column("seq"), 50), 700)))


def reference(kind: str, x: pa.Table) -> set[tuple[Any, ...]]:
    rows = sql(
        f"""select split, key, ws, we, count(*) as c, sum(value) as s, max(value) as mx, min(value) as mn,
        round(avg(value), 6) as av, arg_min(id, t) as f, arg_max(id, t) as l, count(distinct value) as cd
        from ({WINDOWED[kind]}) group by split, key, ws, we""",
        x=x,
    )
    return {tuple(r.values()) for r in rows}


def results(t: pa.Table) -> set[tuple[Any, ...]]:
    assert t.column("udf_sum").equals(t.column("sum_value")), "the user aggregation saw other values"
    cols = ["split", "key", "window_start", "window_end", "count", "sum_value", "max_value", "min_value",
            "mean_value", "first_id", "last_id", "count_distinct_value"]  # fmt: skip
    out = set()
    for r in t.select(cols).to_pylist():
        r["mean_value"] = round(r["mean_value"], 6)
        out.add(tuple(r.values()))
    return out


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("kind", list(ASSIGNERS))
def test_windows_equal_duckdb_over_the_whole_input(kind: str, backend: str, tmp_path: Path) -> None:
    """Two parallel sources and window subtasks, checkpoints every 30 ms, keys of two columns: every window of
    every key, with every aggregation, as DuckDB computes it over the generator's whole input."""
    src = GeneratorSource(num_splits=3, records_per_split=900, batch_size=40, step_ms=10, num_keys=7)
    p = Pipeline(
        "windows",
        checkpoint=CheckpointConfig(interval=0.03, storage=f"{tmp_path}/chk"),
        restart=NoRestart(),
        max_parallelism=16,
        state_backend=BACKENDS[backend],
    )
    s = p.source(src, parallelism=2).map_batches(with_gaps)
    s.key_by(["split", "key"]).window(ASSIGNERS[kind], time="t").aggregate(*AGGS, parallelism=2).sink(
        TwoPhaseCommitTestSink(f"{tmp_path}/out")
    )
    result = p.run(runtime="local", restore="none")
    assert any(c.status == "completed" for c in result.checkpoints)
    got = read_committed(f"{tmp_path}/out")
    assert got is not None
    expected = reference(kind, with_gaps_table(src.expected()))
    assert got.num_rows == len(expected)
    assert results(got) == expected


def with_gaps_table(t: pa.Table) -> pa.Table:
    return pa.Table.from_batches([with_gaps(b) for b in t.to_batches()])


def test_late_records_go_to_the_side_output_and_updates_follow_within_the_allowed_lateness() -> None:
    """A window fires when the watermark passes its end (revision 0); a record for it within the allowed
    lateness emits its updated result at once (revision 1, the whole window's aggregate, not a delta); once
    the watermark passes end + lateness its state is gone and a record for it goes to ``late``."""
    op, out = operator(Tumbling("100ms"), (count(), sum("v")), lateness=50)
    op.process_batch(batch(k=[1, 1, 2], t=[10, 20, 30], v=[1, 2, 3]))
    op.process_watermark(98)
    assert out.rows() == []
    op.process_watermark(99)  # the window [0, 100) ends: its last millisecond is 99
    assert sorted((r["k"], r["count"], r["sum_v"], r["revision"]) for r in out.rows()) == [
        (1, 2, 3, 0),
        (2, 1, 3, 0),
    ]
    op.process_batch(batch(k=[1, 3], t=[50, 120], v=[10, 7]))  # k=1 is late but allowed; t=120 is on time
    assert [(r["k"], r["count"], r["sum_v"], r["revision"]) for r in out.rows()] == [(1, 3, 13, 1)]
    op.process_watermark(148)
    assert out.rows() == [] and not out.side_rows()
    op.process_watermark(149)  # end + lateness passed: the window's state goes
    op.process_batch(batch(k=[1, 2, 3], t=[5, 99, 199], v=[100, 100, 1]))
    assert [(r["k"], r["t"]) for r in out.side_rows()] == [(1, 5), (2, 99)]
    op.end_input()
    got = out.rows()
    assert [(r["k"], r["window_start"], r["count"], r["sum_v"], r["revision"]) for r in got] == [
        (3, 100, 2, 8, 0)
    ]
    assert op.ctx.metrics["late_records"] == 2


def test_without_allowed_lateness_a_late_record_never_changes_a_result() -> None:
    op, out = operator(Sliding("100ms", timedelta(milliseconds=50)), (count(),))
    op.process_batch(batch(k=[1], t=[60]))  # windows [0, 100) and [50, 150)
    op.process_watermark(120)
    assert [(r["window_start"], r["count"]) for r in out.rows()] == [(0, 1)]
    op.process_batch(batch(k=[1, 1], t=[40, 130]))  # 40: only in [0, 100), fired and gone: late
    assert [r["t"] for r in out.side_rows()] == [40]
    op.end_input()
    rows = out.rows()
    assert [(r["window_start"], r["count"]) for r in rows] == [(50, 2), (100, 1)]
    assert "revision" not in rows[0]  # results are final: no revision column


def test_sessions_merge_when_a_record_bridges_them_across_batches_and_checkpoints() -> None:
    """Two sessions of a key, flushed to state by a checkpoint, merge into one when a record falls between
    them; first/last follow event time, not arrival."""
    op, out = operator(Session("10ms"), (count(), first("v"), last("v"), min("t")))
    op.process_batch(batch(k=[1, 1, 2], t=[100, 105, 100], v=[1, 2, 9]))
    op.snapshot_state(1)
    op.process_batch(batch(k=[1, 1], t=[125, 130], v=[4, 5]))
    op.snapshot_state(2)
    op.process_watermark(112)  # key 2's session [100, 110) closed; key 1's [100, 115) waits: watermark < 114
    assert [(r["k"], r["window_start"], r["window_end"], r["count"]) for r in out.rows()] == [
        (2, 100, 110, 1)
    ]
    op.process_batch(batch(k=[1], t=[115], v=[3]))  # [115, 125) touches both: one session [100, 140)
    op.end_input()
    assert [(r["k"], r["window_start"], r["window_end"], r["count"], r["first_v"], r["last_v"], r["min_t"])
            for r in out.rows()] == [(1, 100, 140, 5, 1, 5, 100)]  # fmt: skip


def test_processing_time_windows_count_every_record(tmp_path: Path) -> None:
    """Processing-time tumbling windows: windows follow the wall clock, so only their totals per key are
    fixed; they equal the input's, and every window is 200 ms wide."""
    src = GeneratorSource(
        num_splits=2, records_per_split=600, batch_size=30, num_keys=5, rows_per_second=2000
    )
    p = Pipeline(
        "ptime", checkpoint=CheckpointConfig(interval=0.05, storage=f"{tmp_path}/chk"), restart=NoRestart()
    )
    p.source(src).key_by("key").tumbling_window("200ms", processing_time=True).aggregate(
        count(), sum("value"), parallelism=2
    ).sink(TwoPhaseCommitTestSink(f"{tmp_path}/out"))
    p.run(runtime="local", restore="none")
    got = read_committed(f"{tmp_path}/out")
    assert got is not None
    totals = got.group_by("key").aggregate([("count", "sum"), ("sum_value", "sum")]).to_pylist()
    expected = sql("select key, count(*) c, sum(value) s from x group by key", x=src.expected())
    assert {(r["key"], r["count_sum"], r["sum_value_sum"]) for r in totals} == {
        (r["key"], r["c"], r["s"]) for r in expected
    }
    widths = pc.subtract(
        pc.cast(got.column("window_end"), pa.int64()), pc.cast(got.column("window_start"), pa.int64())
    )
    assert set(widths.to_pylist()) == {200} and pa.types.is_timestamp(got.schema.field("window_start").type)


def test_timestamp_time_columns_give_timestamp_windows() -> None:
    op, out = operator(Tumbling("1s"), (count(),), time="at")
    op.process_batch(pa.record_batch({"k": [1, 1], "at": pa.array([1500, 2500], pa.timestamp("ms"))}))
    op.end_input()
    rows = out.rows()
    assert [r["count"] for r in rows] == [1, 1]
    assert str(rows[0]["window_start"]) == "1970-01-01 00:00:01"


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda k: k.window(Tumbling("1m")), "name the event-time column with time='<column>'"),
        (lambda k: k.window("1m", time="ts"), "expected Tumbling(...), Sliding(...) or Session(...)"),
        (lambda k: k.tumbling_window("a minute", time="ts"), "Tumbling(size): 'a minute' is not a duration: give a number of seconds"),
        (lambda k: k.tumbling_window("60", time="ts"), "Tumbling(size): '60' is a number in a string: give a unit"),
        (lambda k: k.sliding_window("1m", "7s", time="ts"), "size a multiple of slide"),
        (lambda k: k.session_window(0, time="ts"), "Session(gap): must be a duration > 0 (got 0)"),
        (lambda k: k.tumbling_window("1m", time="ts", processing_time=True), "not both"),
        (
            lambda k: k.tumbling_window("1m", time="nope").aggregate(count()),
            "column 'nope' is not in the stream",
        ),
        (lambda k: k.tumbling_window("1m", time="ts").aggregate(), "give at least one aggregation"),
        (lambda k: k.tumbling_window("1m", time="ts").aggregate(sum("value"), sum("value")), "clash"),
        (lambda k: k.tumbling_window("1m", time="ts").aggregate("count"), "expected aggregations"),
        (lambda k: k.tumbling_window("1m", time="ts", allowed_lateness="soon"), "window(allowed_lateness)"),
    ],
)
def test_wrong_options_are_refused_in_one_line(build: Any, message: str, tmp_path: Path) -> None:
    p = Pipeline("bad", checkpoint=CheckpointConfig(storage=f"{tmp_path}/chk"))
    keyed = p.source(GeneratorSource(num_splits=1, records_per_split=10)).key_by("key")
    with pytest.raises(ConfigError) as err:
        build(keyed)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_restored_operator_fires_its_windows_with_the_time_column_type_before_any_batch() -> None:
    """Window state restored from a checkpoint fires at the end of input with no batch seen since: the
    windows keep the time column's timestamp type (it travels with the state)."""
    op, _ = operator(Tumbling("1s"), (count(), sum("v")), time="at")
    op.process_batch(pa.record_batch({"k": [1, 2], "at": pa.array([1500, 2500], pa.timestamp("ms")), "v": [1, 2]}))
    snapshot = op.snapshot_state(1)
    assert snapshot.keyed is not None
    handle = snapshot.keyed.run()
    restored, out = operator(Tumbling("1s"), (count(), sum("v")), time="at")
    restored.initialize_state([handle], [])
    restored.end_input()
    rows = sorted(out.rows(), key=lambda r: r["k"])
    assert [(r["k"], str(r["window_start"]), r["count"], r["sum_v"]) for r in rows] == [
        (1, "1970-01-01 00:00:01", 1, 1),
        (2, "1970-01-01 00:00:02", 1, 2),
    ]


def _a_batch_out_of_order(split: int, start: int, end: int) -> pa.RecordBatch:
    """The generator's rows, but rows 200..239 carry an event time 3 s behind their neighbours (as a batch a
    producer retried lands behind the batches sent after it): past a watermark with no out-of-orderness."""
    b = default_rows(split, start, end, 600, 5, 10)
    seq = b.column("seq").to_numpy()
    ts = b.column("ts").to_numpy() - np.where((seq >= 200) & (seq < 240), 3_000, 0)
    return b.set_column(b.schema.get_field_index("ts"), "ts", pa.array(ts))


def test_late_records_nobody_reads_are_dropped_and_counted_as_flink_does(tmp_path: Path) -> None:
    """Without a stream on ``.side_output("late")`` a late record is dropped and counted (``late_records``;
    Flink's numLateRecordsDropped), the job goes on: it failed with "side output 'late' is not connected"
    (the peers benchmark's window job, on a partition a non-idempotent producer had reordered)."""
    src = GeneratorSource(num_splits=1, records_per_split=600, batch_size=40, step_ms=10, rows=_a_batch_out_of_order)
    p = Pipeline("late-dropped", checkpoint=CheckpointConfig(interval=0.05, storage=f"{tmp_path}/chk"), restart=NoRestart())
    p.source(src).key_by("key").window(Tumbling(0.5), time="ts").aggregate(count()).sink(
        TwoPhaseCommitTestSink(f"{tmp_path}/out")
    )
    result = p.run(runtime="local", restore="none")
    assert result.status == "finished"
    x = src.expected()
    late = pc.and_(pc.greater_equal(x.column("seq"), 200), pc.less(x.column("seq"), 240))
    # the reference, from the input: every row but the displaced batch (its windows closed 2.5 s before it)
    expected = sql("select key, ts - ts % 500 as ws, count(*) as c from x group by all", x=x.filter(pc.invert(late)))
    got = read_committed(f"{tmp_path}/out")
    assert got is not None
    assert {(r["key"], r["window_start"], r["count"]) for r in got.to_pylist()} == {
        (r["key"], r["ws"], r["c"]) for r in expected
    }
    assert result.metrics["late_records"] == 40
