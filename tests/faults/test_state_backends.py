"""The fault suite's keyed shapes on every state backend (issue 24): hashmap and RocksDB, each with and
without changelog checkpoints, and with local recovery, locally and on Spark.

Crash scenarios are those of ``test_exactly_once.py`` (faults armed only where a failure-free run of the same
shape, seed, mode and backend reached; each must fire; committed output, and that failure-free run's, equal
the output computed from the input in plain Python, tests/faults/expected.py), with the first crash's point chosen in turn: the default run crashes each new backend at
every point once (``align`` and ``channel_state`` in a mode that has them, ``global_commit`` with a global
commit) and once on Spark, and rescales a changelog job after a crash. ``-m soak`` runs the cross product:
every backend x every (mode, point) x the keyed shapes, ``SLUICE_SOAK_SCALE`` scenarios per backend
(default 1000), e.g. ``SLUICE_SOAK_SCALE=1000 pytest tests/faults/test_state_backends.py -m soak -k
"soak_crash and rocksdb+changelog-"``; the summary counts fired scenarios per backend.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.faults import test_exactly_once as suite
from tests.faults.backends import BACKENDS
from tests.faults.plans import MODE_POINTS
from tests.faults.shapes import KEYED_SHAPES
from tests.faults.test_exactly_once import crash_scenario, scenario

#: the backends the older tests do not run the fault shapes on: changelog checkpoints on both backends, and
#: local recovery (RocksDB incremental; RocksDB and hashmap with changelog)
NEW = (
    "hashmap+changelog",
    "rocksdb+changelog",
    "rocksdb+local",
    "rocksdb+changelog+local",
    "hashmap+changelog+local",
)
#: every crash point of the aligned, unaligned and adaptive modes
POINTS = tuple(dict.fromkeys(p for mode in ("aligned", "unaligned", "adaptive") for p in MODE_POINTS[mode]))
#: scenarios per backend in ``-m soak`` (each a keyed shape, a mode and a crash point in turn)
SOAK_SCALE = int(os.environ.get("SLUICE_SOAK_SCALE", "1000"))
#: Spark scenarios per backend in ``-m soak``
SOAK_SPARK = int(os.environ.get("SLUICE_SOAK_SPARK", "24"))


def points_of(shape: str, mode: str) -> tuple[str, ...]:
    """The crash points of ``shape`` in ``mode``: the union shape's keyed operator never records channel
    state (its failure-free runs hit ``channel_state`` 0 times), so it is not armed there."""
    return tuple(p for p in MODE_POINTS[mode] if not (shape == "union" and p == "channel_state"))


def every_point(start: int) -> list[tuple[int, str]]:
    """A keyed scenario from ``start`` on per crash point, in a mode (and shape) that has the point."""
    out, i = [], start
    for point in POINTS:
        while scenario(i)[0] not in KEYED_SHAPES or point not in points_of(scenario(i)[0], scenario(i)[2]):
            i += 1
        out.append((i, point))
        i += 1
    return out


def spark_points(start: int) -> list[tuple[str, int, str]]:
    """The default run's Spark scenarios (a Spark run costs tens of seconds): changelog checkpoints on both
    backends, a crash between completion and commit (a restore of materialization + segments) and one while
    processing; local recovery runs on Spark in ``-m soak``."""
    at = {p: i for i, p in every_point(start)}
    return [
        ("hashmap+changelog", at["complete_to_commit"], "complete_to_commit"),
        ("rocksdb+changelog", at["process"], "process"),
    ]


def cross_product(start: int, count: int) -> list[tuple[int, str]]:
    """``count`` keyed scenarios from ``start`` on, the crash points of each (shape, mode) in turn: the list
    covers shape x mode x point (71 combinations) from 100 entries on."""
    out: list[tuple[int, str]] = []
    turn: dict[tuple[str, str], int] = {}
    i = start
    while len(out) < count:
        shape, _, mode, _ = scenario(i)
        if shape in KEYED_SHAPES:
            points = points_of(shape, mode)
            n = turn[shape, mode] = turn.get((shape, mode), -1) + 1
            out.append((i, points[n % len(points)]))
        i += 1
    return out


def _cases(
    backends: tuple[str, ...], pick: list[tuple[int, str]] | None, start: int, count: int
) -> list[Any]:
    """Test cases (backend, scenario, point): ``pick`` for every backend, else ``count`` of the cross
    product per backend (each backend its own scenarios), the backends taking turns: a soak cut short has
    run about as many scenarios on each."""
    per_backend = [
        [
            pytest.param(backend, i, point, id=f"{backend}-{i}-{point}")
            for i, point in (pick if pick is not None else cross_product(start + 100_000 * n, count))
        ]
        for n, backend in enumerate(backends)
    ]
    return [case for turn in zip(*per_backend, strict=True) for case in turn]


def crash(i: int, runtime: str, backend: str, point: str) -> None:
    """Crash scenario ``i`` (``test_exactly_once.crash_scenario``); with local recovery on the in-process
    runtime, every restart restored each file from the local copy (none from checkpoint storage)."""
    run = crash_scenario(i, runtime, backend, point)
    if runtime == "local" and (BACKENDS[backend] or {}).get("local_recovery") and run.result is not None:
        remote = run.result.metrics.get("state.local_recovery.files_remote", 0)
        assert remote == 0, f"{backend} scenario {i}: {remote} file(s) restored from checkpoint storage"


def fast_cases() -> list[Any]:
    """The default run's local scenarios: the changelog backends share the crash points (each point once on
    one of them, the other one's turn in ``-m soak``), and so do the local recovery backends."""
    cases = []
    for start, backends in ((2000, NEW[:2]), (2500, NEW[2:])):
        for n, (i, point) in enumerate(every_point(start)):
            backend = backends[n % len(backends)]
            cases.append(pytest.param(backend, i, point, id=f"{backend}-{i}-{point}"))
    return cases


def soak_every_point() -> list[Any]:
    """The changelog backends' turns at every point that the default run leaves out."""
    fast = {(c.values[0], c.values[2]) for c in fast_cases()}
    return [c for c in _cases(NEW[:2], every_point(2000), 0, 0) if (c.values[0], c.values[2]) not in fast]


@pytest.mark.faults
@pytest.mark.parametrize(("backend", "i", "point"), fast_cases())
def test_crash_at_every_point(backend: str, i: int, point: str) -> None:
    crash(i, "local", backend, point)


@pytest.mark.faults
@pytest.mark.parametrize(
    ("backend", "i", "point"),
    [pytest.param(b, i, p, id=f"{b}-{i}-{p}") for b, i, p in spark_points(3000)],
)
def test_crash_on_spark(backend: str, i: int, point: str, request: pytest.FixtureRequest) -> None:
    request.getfixturevalue("spark")
    crash_scenario(i, "spark", backend, point)


@pytest.mark.faults
@pytest.mark.parametrize(
    ("i", "backend"), [(0, "hashmap+changelog"), (1, "rocksdb+changelog"), (3, "rocksdb+changelog+local")]
)
def test_crash_then_restore_at_another_parallelism(i: int, backend: str, tmp_path: Path) -> None:
    """A changelog job crashes, then resumes its latest checkpoint at another parallelism: the
    materialization and the segments are split by key group."""
    suite.test_crash_then_restore_at_another_parallelism(i, backend, tmp_path)


@pytest.mark.soak
@pytest.mark.parametrize(("backend", "i", "point"), soak_every_point())
def test_soak_crash_at_every_point(backend: str, i: int, point: str) -> None:
    crash(i, "local", backend, point)


@pytest.mark.soak
@pytest.mark.parametrize(("backend", "i", "point"), _cases(tuple(BACKENDS), None, 20_000, SOAK_SCALE))
def test_soak_crash(backend: str, i: int, point: str) -> None:
    crash(i, "local", backend, point)


@pytest.mark.soak
@pytest.mark.parametrize(("backend", "i", "point"), _cases(tuple(BACKENDS), None, 900_000, SOAK_SPARK))
def test_soak_crash_on_spark(backend: str, i: int, point: str, request: pytest.FixtureRequest) -> None:
    request.getfixturevalue("spark")
    crash_scenario(i, "spark", backend, point)


@pytest.mark.soak
@pytest.mark.parametrize("backend", NEW)
@pytest.mark.parametrize("i", range(8, 28))
def test_soak_rescale(i: int, backend: str, tmp_path: Path) -> None:
    suite.test_crash_then_restore_at_another_parallelism(i, backend, tmp_path)
