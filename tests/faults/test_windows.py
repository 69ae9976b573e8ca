"""Window operators under the fault shapes: committed output equals a failure-free run's and DuckDB's over
the whole input, through crashes at every point (aligned, unaligned, adaptive checkpoints), on both
runtimes and both state backends, and after a crash restored at another parallelism.

Each shape keys the generator's rows by ``k`` (all rows of a key come from one split, in event-time order,
so first/last are deterministic) and aggregates them in tumbling, sliding or session windows of an
event time ``t`` that pauses every 48 rows (sessions end there). The default run is a fast slice;
``-m soak`` runs many more.
"""

from __future__ import annotations

import functools
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from sluice import Pipeline
from sluice import windows as w
from sluice.connectors.generator import GeneratorSource
from sluice.testing.faults import FaultInjector, HitCounter

from tests.faults.plans import crash_plan, injector_for
from tests.faults.rescale import SCALES, crash_then_rescale_on_spark
from tests.faults.shapes import Build, Shape, _gen, record, rows_of, run_shape, with_key
from tests.windows.helpers import sql

MODES = ("aligned", "unaligned", "adaptive")
#: the generators of the runs, by their output folder (for the DuckDB reference)
SOURCES: dict[str, GeneratorSource] = {}
ASSIGNERS: dict[str, w.WindowAssigner] = {
    "window_tumbling": w.Tumbling("200ms"),
    "window_sliding": w.Sliding("300ms", "100ms"),
    "window_session": w.Session("100ms"),
}
#: per shape: the input with each row's window bounds (ws, we), in DuckDB
BOUNDS = {
    "window_tumbling": "select *, t - t % 200 as ws, t - t % 200 + 200 as we from x",
    "window_sliding": "select *, t - t % 100 - j * 100 as ws, t - t % 100 - j * 100 + 300 as we "
    "from x, (values (0), (1), (2)) as r(j)",
    "window_session": """
        with marked as (
            select *, case when t - lag(t) over (partition by k order by t) <= 100 then 0 else 1 end as new from x),
        numbered as (select *, sum(new) over (partition by k order by t rows unbounded preceding) as sid from marked)
        select *, min(t) over (partition by k, sid) as ws, max(t) over (partition by k, sid) + 100 as we
        from numbered""",
}


def keyed_with_pauses(b: pa.RecordBatch) -> pa.RecordBatch:
    """``k`` (shapes.with_key) and ``t``: the event time plus 500 ms after every 48 rows of a split."""
    b = with_key(b)
    return b.append_column("t", pc.add(b.column("ts"), pc.multiply(pc.divide(b.column("seq"), 48), 500)))


def _windowed(name: str) -> Shape:
    def build(p: Pipeline, b: Build) -> None:
        src = _gen(b)
        SOURCES[b.out] = src
        s = p.source(src, parallelism=b.par()).map_batches(keyed_with_pauses)
        s.key_by("k").window(ASSIGNERS[name], time="t").aggregate(
            w.count(),
            w.sum("value"),
            w.max("value"),
            w.first("id"),
            w.last("id"),
            w.count_distinct("value"),
            parallelism=b.par(),
        ).sink(b.sink(), parallelism=b.par())

    return Shape(name, build)


SHAPES = [_windowed(n) for n in ASSIGNERS]
SHAPE = {s.name: s for s in SHAPES}


def scenario(i: int) -> tuple[str, int, str, random.Random]:
    """Scenario ``i``: a shape, a seed (shared by pairs), a mode, its own rng."""
    return (
        SHAPES[(i // 2) % 3].name,
        random.Random(7_000 + i // 2).randint(0, 10**6),
        MODES[i % 3],
        random.Random(i),
    )


def alignment(mode: str, rng: random.Random) -> dict[str, Any]:
    if mode == "unaligned":
        return {"unaligned": True}
    return {"aligned_checkpoint_timeout": rng.choice([0.0, 0.002, 0.02])} if mode == "adaptive" else {}


def duckdb_rows(shape: str, src: GeneratorSource) -> list[tuple[Any, ...]]:
    """The windows DuckDB computes over the generator's whole input, as the committed rows are compared."""
    x = pa.Table.from_batches([keyed_with_pauses(b) for b in src.expected().to_batches()])
    got = sql(
        f"""select k, ws as window_start, we as window_end, count(*) as count, sum(value)::bigint as sum_value,
        max(value) as max_value, arg_min(id, t) as first_id, arg_max(id, t) as last_id,
        count(distinct value) as count_distinct_value from ({BOUNDS[shape]}) group by k, ws, we""",
        x=x,
    )
    return rows_of(pa.Table.from_pylist(got))


@functools.cache
def reference(shape: str, seed: int) -> tuple[tuple[Any, ...], ...]:
    """A failure-free aligned run's committed rows, checked against DuckDB's."""
    run = run_shape(SHAPE[shape], seed, None)
    out = next(o for o in SOURCES if o.startswith(run.checkpoints.removesuffix("/chk")))
    assert run.rows and run.rows == duckdb_rows(shape, SOURCES.pop(out)), (
        f"{shape} {seed}: differs from DuckDB"
    )
    return tuple(run.rows)


@functools.cache
def hits(shape: str, seed: int, mode: str, backend: str, scale: int | None = None) -> dict[str, int]:
    """Hits per fault point of a failure-free run (every parallelism ``scale``, else drawn), whose output
    must equal the reference."""
    counter = HitCounter()
    al = alignment(mode, random.Random(0)) if mode != "aligned" else None
    run = run_shape(SHAPE[shape], seed, counter, alignment=al, backend=backend, scale=scale)
    assert tuple(run.rows) == reference(shape, seed), (
        f"{shape} {mode} {backend} scale={scale}: differs from the reference"
    )
    return dict(counter.hits)


def check(label: str, got: list[tuple[Any, ...]], expected: tuple[tuple[Any, ...], ...]) -> None:
    g, e = Counter(got), Counter(expected)
    lost, dup = sum((e - g).values()), sum((g - e).values())
    assert not lost and not dup, (
        f"{label}: {lost} rows lost, {dup} duplicated ({len(got)} of {len(expected)})"
    )


def crash_scenario(i: int, runtime: str, backend: str) -> None:
    shape, seed, mode, rng = scenario(i)
    expected = reference(shape, seed)
    plan = crash_plan(rng, hits(shape, seed, mode, backend), mode, crashes=1 + (i % 3 == 0))
    faults, armed = injector_for(plan, runtime, rng)
    run = run_shape(
        SHAPE[shape], seed, faults, alignment=alignment(mode, rng), runtime=runtime, backend=backend
    )
    label = f"{shape} {mode} {runtime} {backend} seed={seed} plan={plan} fired={faults.fired}"
    record(
        "window-crash",
        i,
        shape,
        mode,
        len(faults.fired) == armed,
        len(faults.fired),
        run.rows,
        expected,
        backend=backend,
    )
    assert run.error is None, f"{label}: {run.error}"
    assert len(faults.fired) == armed, f"{label}: armed faults did not fire"
    check(label, run.rows, expected)


def spark_rescale_scenario(i: int, backend: str, tmp: Path) -> None:
    """A crash at a random reachable point of a run on Spark, a restart and a crash after a completed
    checkpoint end it; a second run on Spark resumes that checkpoint at another parallelism
    (tests/faults/rescale.py): window state and timers move by key group."""
    shape, seed, mode, rng = scenario(i)
    expected = reference(shape, seed)
    scales = rng.choice(SCALES)
    plan = crash_plan(rng, hits(shape, seed, mode, backend, scales[0]), mode, crashes=1)
    r = crash_then_rescale_on_spark(
        SHAPE[shape], seed, plan, tmp, rng, scales=scales, alignment=alignment(mode, rng), backend=backend
    )
    label = f"{shape} {mode} {backend} {scales[0]}->{scales[1]} on Spark seed={seed} plan={plan} fired={r.fired}"
    record("window-rescale-spark", i, shape, mode, r.all_fired, len(r.fired), r.second.rows, expected, backend=backend)
    assert r.first.error is not None, f"{label}: the first run did not fail"
    assert r.all_fired, f"{label}: armed faults did not fire"
    assert r.second.error is None, f"{label}: {r.second.error}"
    check(label, r.second.rows, expected)


#: the default slice: every shape in every mode on each backend locally; on Spark a crash on the hashmap
#: backend, and a crash then a rescale on RocksDB
FAST_LOCAL = [(i, b) for b in ("hashmap", "rocksdb") for i in range(9)]
FAST_SPARK = [(0, "hashmap")]
FAST_SPARK_RESCALE = [(4, "rocksdb")]
#: the soak's Spark rescales: every shape in every mode, on both backends
SOAK_SPARK_RESCALE = [(i, b) for i in (1, 2, 3, 5, 7) for b in ("hashmap", "rocksdb")]


@pytest.mark.faults
@pytest.mark.parametrize(("i", "backend"), FAST_LOCAL, ids=[f"{b}-{i}" for i, b in FAST_LOCAL])
def test_window_crash(i: int, backend: str) -> None:
    crash_scenario(i, "local", backend)


@pytest.mark.faults
@pytest.mark.parametrize(("i", "backend"), FAST_SPARK, ids=[f"{b}-{i}" for i, b in FAST_SPARK])
def test_window_crash_on_spark(i: int, backend: str, request: pytest.FixtureRequest) -> None:
    request.getfixturevalue("spark")
    crash_scenario(i, "spark", backend)


@pytest.mark.faults
@pytest.mark.parametrize(("i", "backend"), FAST_SPARK_RESCALE, ids=[f"{b}-{i}" for i, b in FAST_SPARK_RESCALE])
def test_window_crash_on_spark_then_restore_on_spark_at_another_parallelism(
    i: int, backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    request.getfixturevalue("spark")
    spark_rescale_scenario(i, backend, tmp_path)


@pytest.mark.faults
@pytest.mark.parametrize(("i", "backend"), [(0, "hashmap"), (1, "rocksdb"), (2, "rocksdb")])
def test_window_crash_then_restore_at_another_parallelism(i: int, backend: str, tmp_path: Path) -> None:
    """A crash after a completed checkpoint ends the first run; the second resumes it at another parallelism
    (window state and timers move by key group, an unaligned checkpoint's in-flight data too)."""
    shape, seed, mode, rng = scenario(2 * i)
    expected = reference(shape, seed)
    faults = FaultInjector(point="complete_to_commit", after=0)
    first_scale, second_scale = (rng.choice([1, 2]), rng.choice([3, 4]))
    if i % 2:
        first_scale, second_scale = second_scale, first_scale
    kw: dict[str, Any] = {"directory": str(tmp_path), "backend": backend, "alignment": alignment(mode, rng)}
    first_run = run_shape(SHAPE[shape], seed, faults, attempts=0, scale=first_scale, **kw)
    assert first_run.error is not None and faults.all_fired, f"{shape}: the first run did not crash"
    second = run_shape(SHAPE[shape], seed, None, scale=second_scale, restore="latest", **kw)
    label = f"{shape} {mode} {backend} {first_scale}->{second_scale} seed={seed}"
    assert second.error is None, f"{label}: {second.error}"
    record("window-rescale", i, shape, mode, True, 1, second.rows, expected, backend=backend)
    check(label, second.rows, expected)


@pytest.mark.soak
@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
@pytest.mark.parametrize("i", range(9, 309))
def test_soak_window_crash(i: int, backend: str) -> None:
    crash_scenario(i, "local", backend)


@pytest.mark.soak
@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
@pytest.mark.parametrize("i", range(1, 11))
def test_soak_window_crash_on_spark(i: int, backend: str, request: pytest.FixtureRequest) -> None:
    request.getfixturevalue("spark")
    crash_scenario(i, "spark", backend)


@pytest.mark.soak
@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
@pytest.mark.parametrize("i", range(3, 23))
def test_soak_window_rescale(i: int, backend: str, tmp_path: Path) -> None:
    test_window_crash_then_restore_at_another_parallelism(i, backend, tmp_path)


@pytest.mark.soak
@pytest.mark.parametrize(("i", "backend"), SOAK_SPARK_RESCALE, ids=[f"{b}-{i}" for i, b in SOAK_SPARK_RESCALE])
def test_soak_window_spark_rescale(i: int, backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    request.getfixturevalue("spark")
    spark_rescale_scenario(i, backend, tmp_path)
