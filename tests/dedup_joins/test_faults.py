"""Exactly once for deduplication and the joins under the fault suite's crashes (tests/faults): a crash at
every reachable point, aligned, unaligned and adaptive checkpoints, a restore at another parallelism, on
both runtimes and both state backends. Each scenario's committed output must equal the pure-Python reference
over the whole input (and the failure-free run of the same shape, seed and mode, which the plan is drawn
from, must equal it too); only scenarios whose armed faults all fired count.

The default run is a slice (every shape in every mode, alternating backends; each shape once on Spark);
``-m soak`` runs many more.
"""

from __future__ import annotations

import functools
import random
import tempfile
from pathlib import Path
from typing import Any

import pytest
from sluice.testing.faults import FaultInjector, HitCounter

from tests.dedup_joins.shapes import SHAPE, SHAPES
from tests.faults.plans import crash_plan, injector_for
from tests.faults.rescale import SCALES, crash_then_rescale_on_spark
from tests.faults.shapes import BACKENDS, pipeline_of, record, run_shape
from tests.faults.test_exactly_once import MODES, alignment, check_exactly_once

NAMES = [s.name for s in SHAPES]


def scenario(i: int) -> tuple[str, int, str, str, random.Random]:
    """Scenario ``i``: a shape, a seed, a mode, a backend (every combination within 24 scenarios)."""
    shape = NAMES[i % len(NAMES)]
    mode = MODES[(i // len(NAMES)) % 3]
    backend = list(BACKENDS)[(i // (3 * len(NAMES))) % 2]
    return shape, random.Random(i).randint(0, 10**6), mode, backend, random.Random(30_000 + i)


@functools.cache
def reference(shape: str, seed: int) -> tuple[tuple[Any, ...], ...]:
    """The pure-Python reference of the shape's input (no job runs)."""
    with tempfile.TemporaryDirectory() as d:
        rows = pipeline_of(SHAPE[shape], seed, d).reference()  # type: ignore[attr-defined]
    assert rows, "the reference is empty"
    return tuple(rows)


@functools.cache
def hits(shape: str, seed: int, mode: str, backend: str, scale: int | None = None) -> dict[str, int]:
    """Hits per fault point of a failure-free run (every parallelism ``scale``, else drawn), whose output must
    equal the reference."""
    counter = HitCounter()
    al = alignment(mode, random.Random(0)) if mode != "aligned" else None
    run = run_shape(SHAPE[shape], seed, counter, alignment=al, backend=backend, scale=scale)
    assert run.error is None, run.error
    check_exactly_once(f"{shape} {mode} {backend} scale={scale} failure-free", run.rows, reference(shape, seed))
    return dict(counter.hits)


def crash_scenario(i: int, runtime: str) -> None:
    shape, seed, mode, backend, rng = scenario(i)
    expected = reference(shape, seed)
    plan = crash_plan(rng, hits(shape, seed, mode, backend), mode, crashes=1 + (i % 3 == 0))
    faults, armed = injector_for(plan, runtime, rng)
    run = run_shape(SHAPE[shape], seed, faults, alignment=alignment(mode, rng), runtime=runtime, backend=backend)
    label = f"{shape} {mode} {runtime} {backend} seed={seed} plan={plan} fired={faults.fired}"
    record("crash", f"dj-{i}", shape, mode, len(faults.fired) == armed, len(faults.fired), run.rows, expected, backend=backend)
    assert run.error is None, f"{label}: {run.error}"
    assert len(faults.fired) == armed, f"{label}: armed faults did not fire"
    check_exactly_once(label, run.rows, expected)


FAST = 24  # every shape x mode x backend once
#: on Spark in the default run (a Spark run takes about a minute here): join_latest (two inputs) on the hashmap
#: backend, unaligned (and dedup keep="last" on RocksDB crashes, then rescales, below). The soak adds dedup
#: keep="first" (hashmap) and the interval join (RocksDB, unaligned), then more
SPARK = [6]
SPARK_SOAK = [13, 0, 19, *range(FAST, FAST + 24)]


@pytest.mark.faults
@pytest.mark.parametrize("i", range(FAST))
def test_crash(i: int) -> None:
    crash_scenario(i, "local")


@pytest.mark.faults
@pytest.mark.parametrize("i", SPARK)
def test_crash_on_spark(i: int, request: pytest.FixtureRequest) -> None:
    request.getfixturevalue("spark")
    crash_scenario(i, "spark")


def rescale_scenario(i: int, tmp: Path) -> None:
    """A crash ends the first run (no restart); a second run resumes its latest checkpoint at another
    parallelism: keyed state and the joins' buffers are split by key group, an unaligned checkpoint's
    in-flight data too (the default slice is aligned; the soak runs every mode)."""
    shape, seed, mode, backend, rng = scenario(i)
    expected = reference(shape, seed)
    first_scale, second_scale = rng.choice([(1, 3), (3, 1), (2, 4), (4, 2)])
    faults = FaultInjector(point="complete_to_commit", after=0)
    kw: dict[str, Any] = {"directory": str(tmp), "backend": backend, "alignment": alignment(mode, rng)}
    first = run_shape(SHAPE[shape], seed, faults, attempts=0, scale=first_scale, **kw)
    assert first.error is not None and faults.all_fired, f"{shape}: the first run did not crash ({faults.fired})"
    second = run_shape(SHAPE[shape], seed, None, scale=second_scale, restore="latest", **kw)
    label = f"{shape} {mode} {backend} {first_scale}->{second_scale} seed={seed}"
    assert second.error is None, f"{label}: {second.error}"
    record("rescale", f"dj-{i}", shape, mode, True, 1, second.rows, expected, backend=backend)
    check_exactly_once(label, second.rows, expected)


@pytest.mark.faults
@pytest.mark.parametrize("i", [0, 1, 2, 3, 12, 13, 14, 15])
def test_crash_then_restore_at_another_parallelism(i: int, tmp_path: Path) -> None:
    rescale_scenario(i, tmp_path)


def spark_rescale_scenario(i: int, tmp: Path) -> None:
    """A crash at a random reachable point of a run on Spark, a restart and a crash after a completed
    checkpoint end it; a second run on Spark resumes that checkpoint at another parallelism
    (tests/faults/rescale.py). The failure-free run at the first parallelism equals the reference too."""
    shape, seed, mode, backend, rng = scenario(i)
    expected = reference(shape, seed)
    scales = rng.choice(SCALES)
    plan = crash_plan(rng, hits(shape, seed, mode, backend, scales[0]), mode, crashes=1)
    r = crash_then_rescale_on_spark(
        SHAPE[shape], seed, plan, tmp, rng, scales=scales, alignment=alignment(mode, rng), backend=backend
    )
    label = f"{shape} {mode} {backend} {scales[0]}->{scales[1]} on Spark seed={seed} plan={plan} fired={r.fired}"
    record("rescale-spark", f"dj-{i}", shape, mode, r.all_fired, len(r.fired), r.second.rows, expected, backend=backend)
    assert r.first.error is not None, f"{label}: the first run did not fail"
    assert r.all_fired, f"{label}: armed faults did not fire"
    assert r.second.error is None, f"{label}: {r.second.error}"
    check_exactly_once(label, r.second.rows, expected)


#: crash then rescale on Spark in the default run: dedup keep="last" on RocksDB, aligned; the soak runs every
#: shape on both backends, in every mode
SPARK_RESCALE = [13]
SPARK_RESCALE_SOAK = [0, 3, 6, 9, 10, 11, 14, 16, 17, 19, 22]


@pytest.mark.faults
@pytest.mark.parametrize("i", SPARK_RESCALE)
def test_crash_on_spark_then_restore_on_spark_at_another_parallelism(
    i: int, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    request.getfixturevalue("spark")
    spark_rescale_scenario(i, tmp_path)


@pytest.mark.soak
@pytest.mark.parametrize("i", SPARK_RESCALE_SOAK)
def test_soak_spark_rescale(i: int, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    request.getfixturevalue("spark")
    spark_rescale_scenario(i, tmp_path)


@pytest.mark.soak
@pytest.mark.parametrize("i", range(FAST, FAST + 480))
def test_soak_crash(i: int) -> None:
    crash_scenario(i, "local")


@pytest.mark.soak
@pytest.mark.parametrize("i", SPARK_SOAK)
def test_soak_crash_on_spark(i: int, request: pytest.FixtureRequest) -> None:
    request.getfixturevalue("spark")
    crash_scenario(i, "spark")


@pytest.mark.faults
@pytest.mark.parametrize(("i", "scales"), [(19, (1, 3)), (19, (3, 1)), (7, (3, 1))])
def test_unaligned_crash_then_restore_where_the_rescale_rechains(
    i: int, scales: tuple[int, int], tmp_path: Path
) -> None:
    """The interval join's sink (parallelism 1) is chained behind the join at parallelism 1, not at 3; the
    inputs' typed maps (parallelism 1) behind their sources likewise. An unaligned checkpoint's in-flight data
    moves to the operator it was on its way to (before sluice.runtime.rechain, 1 -> 3 replayed the join's
    input into the sink and failed, 3 -> 1 lost the sink's input)."""
    shape, seed, mode, backend, rng = scenario(i)
    assert (shape, mode) == ("interval", "unaligned")
    expected = reference(shape, seed)
    kw: dict[str, Any] = {"directory": str(tmp_path), "backend": backend, "alignment": {"unaligned": True}}
    faults = FaultInjector(point="complete_to_commit", after=rng.randint(0, 2))
    first = run_shape(SHAPE[shape], seed, faults, attempts=0, scale=scales[0], **kw)
    assert first.error is not None and faults.all_fired, f"{shape}: the first run did not crash ({faults.fired})"
    second = run_shape(SHAPE[shape], seed, None, attempts=0, scale=scales[1], restore="latest", **kw)
    label = f"{shape} unaligned {backend} {scales[0]}->{scales[1]} seed={seed}"
    assert second.error is None, f"{label}: {second.error}"
    record("rescale", f"dj-rechain-{i}", shape, mode, True, 1, second.rows, expected, backend=backend)
    check_exactly_once(label, second.rows, expected)


@pytest.mark.soak
@pytest.mark.parametrize("i", range(24, 72))
def test_soak_rescale(i: int, tmp_path: Path) -> None:
    rescale_scenario(i, tmp_path)
