"""Exactly-once under randomized crashes: committed output equals a failure-free run's.

The default slice runs ``FAST`` scenarios (seeds x shapes, random crash points, parallelism 1-4); the soak
(``-m soak``) runs many more with several crashes each.
"""

from __future__ import annotations

import functools
import random

import pytest
from sluice.testing.faults import POINTS, FaultInjector

from tests.faults.shapes import SCENARIO_LOG, SHAPES, Shape, rows_of, run_shape

ENGINE_POINTS = tuple(p for p in POINTS if p != "compaction")
FAST = 220
SOAK = 1500


@functools.cache
def reference(shape_name: str, seed: int) -> tuple:
    shape = next(s for s in SHAPES if s.name == shape_name)
    return tuple(rows_of(run_shape(shape, seed, None)))


MODES = ("aligned", "unaligned", "adaptive")


def alignment(mode: str, rng: random.Random) -> dict[str, object]:
    if mode == "unaligned":
        return {"unaligned": True}
    if mode == "adaptive":
        return {"aligned_checkpoint_timeout": rng.choice([0.0, 0.002, 0.02])}
    return {}


def scenario(i: int, crashes: int = 1) -> tuple[Shape, int, FaultInjector]:
    """Scenario ``i``: a shape, a seed (shared by pairs of scenarios, so references are reused), a fault plan."""
    shape = SHAPES[(i // 2) % len(SHAPES)]
    seed = random.Random(i // 2).randint(0, 10**6)
    rng = random.Random(10_000 + i)
    return (
        shape,
        seed,
        FaultInjector.random(rng, ENGINE_POINTS, max_after=rng.choice([3, 10, 40]), crashes=crashes),
    )


def check(i: int, crashes: int) -> None:
    shape, seed, faults = scenario(i, crashes)
    mode = MODES[i % 3]
    expected = reference(shape.name, seed)
    assert expected, "the failure-free run committed nothing"
    got = rows_of(run_shape(shape, seed, faults, alignment=alignment(mode, random.Random(i))))
    SCENARIO_LOG.append({"scenario": i, "shape": shape.name, "mode": mode, "fired": len(faults.fired)})
    assert len(got) == len(expected), (
        f"{shape.name} {mode} seed={seed} faults={faults.fired}: {len(got)} rows committed, expected {len(expected)}"
    )
    assert got == list(expected), f"{shape.name} {mode} seed={seed} faults={faults.fired}: committed output differs"


@pytest.mark.faults
@pytest.mark.parametrize("i", range(FAST))
def test_exactly_once_random_crash(i: int) -> None:
    check(i, crashes=1 + (i % 3 == 0))


@pytest.mark.soak
@pytest.mark.parametrize("i", range(FAST, FAST + SOAK))
def test_exactly_once_soak(i: int) -> None:
    check(i, crashes=1 + i % 4)


@pytest.mark.faults
@pytest.mark.parametrize("i", range(12))
def test_at_least_once_loses_nothing(i: int) -> None:
    shape, seed, faults = scenario(i)
    expected = set(reference(shape.name, seed))
    got = rows_of(run_shape(shape, seed, faults, mode="at_least_once"))
    ids = {r for r in got}
    SCENARIO_LOG.append({"scenario": f"alo-{i}", "shape": shape.name, "fired": len(faults.fired)})
    if shape.name in ("chain", "rebalance"):
        assert ids == expected
    else:
        # replays may re-count keys downstream; every input id is still present
        assert {r[1] if shape.name != "chain" else r for r in expected} <= {r[1] for r in got}
