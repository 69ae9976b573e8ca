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
def hits(shape: str, seed: int, mode: str, backend: str) -> dict[str, int]:
    """Hits per fault point of a failure-free run, whose output must equal the reference."""
    counter = HitCounter()
    al = alignment(mode, random.Random(0)) if mode != "aligned" else None
    run = run_shape(SHAPE[shape], seed, counter, alignment=al, backend=backend)
    assert run.error is None, run.error
    check_exactly_once(f"{shape} {mode} {backend} failure-free", run.rows, reference(shape, seed))
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
#: on Spark in the default run (a Spark run takes about a minute here): dedup keep="last" on RocksDB, aligned;
#: join_latest (two inputs) on the hashmap backend, unaligned. The soak adds dedup keep="first" (hashmap) and
#: the interval join (RocksDB, unaligned), then more
SPARK = [13, 6]
SPARK_SOAK = [0, 19, *range(FAST, FAST + 24)]


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
    parallelism: keyed state and the joins' buffers are split by key group."""
    shape, seed, _, backend, rng = scenario(i)
    expected = reference(shape, seed)
    first_scale, second_scale = rng.choice([(1, 3), (3, 1), (2, 4), (4, 2)])
    faults = FaultInjector(point="complete_to_commit", after=0)
    kw: dict[str, Any] = {"directory": str(tmp), "backend": backend}
    first = run_shape(SHAPE[shape], seed, faults, attempts=0, scale=first_scale, **kw)
    assert first.error is not None and faults.all_fired, f"{shape}: the first run did not crash ({faults.fired})"
    second = run_shape(SHAPE[shape], seed, None, scale=second_scale, restore="latest", **kw)
    label = f"{shape} {backend} {first_scale}->{second_scale} seed={seed}"
    assert second.error is None, f"{label}: {second.error}"
    record("rescale", f"dj-{i}", shape, "aligned", True, 1, second.rows, expected, backend=backend)
    check_exactly_once(label, second.rows, expected)


@pytest.mark.faults
@pytest.mark.parametrize("i", [0, 1, 2, 3, 12, 13, 14, 15])
def test_crash_then_restore_at_another_parallelism(i: int, tmp_path: Path) -> None:
    rescale_scenario(i, tmp_path)


@pytest.mark.soak
@pytest.mark.parametrize("i", range(FAST, FAST + 480))
def test_soak_crash(i: int) -> None:
    crash_scenario(i, "local")


@pytest.mark.soak
@pytest.mark.parametrize("i", SPARK_SOAK)
def test_soak_crash_on_spark(i: int, request: pytest.FixtureRequest) -> None:
    request.getfixturevalue("spark")
    crash_scenario(i, "spark")


@pytest.mark.soak
@pytest.mark.parametrize("i", range(24, 72))
def test_soak_rescale(i: int, tmp_path: Path) -> None:
    rescale_scenario(i, tmp_path)
