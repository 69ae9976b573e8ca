"""Merge-on-read upserts exactly once: the change stream of tests/faults/test_upsert_exactly_once.py into an
IcebergSink with ``write_mode="merge-on-read"``, a crash at every point a checkpoint passes (a second one
while restoring), a restore at another parallelism, on moto's S3 and on Spark; in most scenarios the
background rewrite folds deletes every other commit, so rows move under the index.

Besides the checks of the copy-on-write scenarios (the table equals the stream applied in order, every
snapshot is a per-split prefix of it, no checkpoint applied twice, no staged file left), each scenario reads
the primary-key index out of the job's last completed checkpoint and compares it with the table read apart
from the sink (every entry is its key's live row, every live row has its entry), and finds no
position-delete file that no snapshot names. The default run is a fast slice; ``-m soak`` runs more.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sluice.testing.faults import FaultInjector, HitCounter, PlannedFault

from tests.faults.plans import _first
from tests.faults.test_upsert_exactly_once import RATE, STREAM, check, run, target_of
from tests.sinks.tables.cdc import check_versions, table_state
from tests.sinks.tables.helpers import Target
from tests.sinks.tables.mor import MOR, check_index, index_in_checkpoint, orphan_deletes
from tests.sinks.tables.paced import Paced

#: the points a merge-on-read checkpoint passes: while writing, in the writer's pre-commit (data files
#: written, index not yet updated), between snapshot and ack, between completion and the commit, with the
#: commit landed but not yet known, after it before the notification, at the final checkpoint
POINTS = ("process", "source", "pre_commit", "snapshot_to_ack", "global_commit", "commit", "complete_to_commit",
          "final_checkpoint")  # fmt: skip


@functools.cache
def hits() -> dict[str, int]:
    """Hits per fault point of a failure-free merge-on-read run (whose table must equal the reference)."""
    import tempfile

    counter = HitCounter()
    with tempfile.TemporaryDirectory(prefix="sluice-mor-hits-") as d:
        target = Target("iceberg", f"{d}/lake", {}, d)
        result = run(target, Path(d), counter, **MOR)
        assert not isinstance(result, Exception), result
        assert table_state(target.read()) == STREAM.final(), "a failure-free merge-on-read run differs"
    return dict(counter.hits)


def until_rewritten(target: Target, until: Callable[[], bool] | None = None) -> Any:
    """STREAM for a job with the background rewrite on: two batches a checkpoint (so each attempt that has
    changes left commits several times however slow its checkpoints are, and rounds come due), and the input
    ends only once a rewrite committed (or ``until`` holds), so the job cannot finish before the round it asked for. On a loaded
    machine a rate-paced source fitted an attempt's changes into one checkpoint commit: with ``every=2`` no
    round came due, and the rewrite check failed though nothing was wrong."""
    return Paced(num_splits=STREAM.splits, records_per_split=STREAM.per_split, batch_size=STREAM.batch,
                 rows=STREAM.rows(), name="changes", rows_per_second=RATE, chunk_batches=2,
                 until=until or target.rewrote)  # fmt: skip


def check_mor(label: str, target: Target, tmp: Path, rewrites: bool, result: Any = None) -> None:
    """The index of the last completed checkpoint describes the table; no orphan position-delete file; the
    rewrite (if on) committed."""
    check_index(target, index_in_checkpoint(f"{tmp}/chk", "cdc"))
    metrics = getattr(result, "metrics", None)
    assert not rewrites or target.rewrites() >= 1, f"{label}: the rewrite never committed ({metrics})"
    assert orphan_deletes(target) == [], f"{label}: position-delete files no snapshot names"


def crash_scenario(i: int, tmp: Path, request: pytest.FixtureRequest, runtime: str = "local", store: str = "local") -> None:
    point = POINTS[i % len(POINTS)]
    rng = random.Random(5000 + i)
    count = hits().get(point, 0)
    assert count > 0, f"a failure-free merge-on-read run never reached {point}"
    plan = [_first(rng, point, count)]
    if i % 3 == 2 and point in ("global_commit", "commit", "complete_to_commit", "final_checkpoint", "pre_commit"):
        plan.append(PlannedFault("restore", 0))  # and again while restoring from that crash
    faults = FaultInjector(plan=plan)
    target = target_of("iceberg", store, tmp, request)
    extra: dict[str, Any] = {"partition_by": ["bucket(4, id)"]} if i % 2 else {}
    source = None
    if i % 3 != 1:  # the rewrite folds deletes every other commit: rows move under the index
        extra["rewrite"] = {"every": 2, "min_files": 2}
        source = until_rewritten(target)
    parallelism = rng.choice([1, 2, 3])
    result = run(target, tmp, faults, runtime=runtime, parallelism=parallelism, source=source, **MOR, **extra)
    label = f"merge-on-read upsert on {runtime}/{store}, plan={plan}, fired={faults.fired}"
    check(label, target, result, faults.all_fired, faults.crashes, "upsert-mor", i)
    check_mor(label, target, tmp, "rewrite" in extra, result)


@pytest.mark.faults
@pytest.mark.parametrize("i", [pytest.param(i, marks=[pytest.mark.soak] if i % 2 else []) for i in range(len(POINTS))])
def test_a_crash_at_every_point_loses_and_doubles_no_change(i: int, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    crash_scenario(i, tmp_path, request)


@pytest.mark.faults
@pytest.mark.parametrize(("runtime", "store", "i"), [("spark", "s3", 5), ("local", "s3", 2)], ids=["spark-s3", "local-s3"])
def test_crashes_on_spark_and_on_s3(runtime: str, store: str, i: int, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if runtime == "spark":
        request.getfixturevalue("spark")
    crash_scenario(i, tmp_path, request, runtime, store)


def rescale_scenario(i: int, tmp: Path, request: pytest.FixtureRequest, store: str = "local") -> None:
    """A crash ends the first run; a second run restores its latest checkpoint at another parallelism (the
    index's key groups move to other writers) and finishes the stream."""
    rng = random.Random(6000 + i)
    target = target_of("iceberg", store, tmp, request)
    point = rng.choice(["complete_to_commit", "commit", "global_commit", "pre_commit"])
    faults = FaultInjector(point=point, after=rng.randint(0, 1))
    rewrite = {"rewrite": {"every": 2, "min_files": 2}}
    # paced in both runs: the first crashes within its first checkpoints, so the second has changes for
    # several commits left, and rounds come due there too
    first = run(target, tmp, faults, parallelism=rng.choice([1, 2]), attempts=0, source=until_rewritten(target),
                **MOR, **rewrite)  # fmt: skip
    assert isinstance(first, Exception) and faults.all_fired, f"the first run did not crash at {point}"
    check_versions(STREAM, target)
    # the rescaled run must commit a rewrite of its own: one the first run committed before its crash
    # would otherwise satisfy both the source's wait and the check
    before = target.rewrites()
    source = until_rewritten(target, lambda: target.rewrites() > before)
    second = run(target, tmp, None, parallelism=3, restore="latest", source=source, **MOR, **rewrite)
    label = f"merge-on-read: crash at {point}, restore rescaled"
    check(label, target, second, True, 1, "upsert-mor-rescale", i, False)
    check_mor(label, target, tmp, True, second)
    assert target.rewrites() > before, f"{label}: no rewrite committed after the rescaled restore"


@pytest.mark.faults
def test_a_crash_then_a_restore_at_another_parallelism(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    rescale_scenario(0, tmp_path, request)


@pytest.mark.soak
@pytest.mark.parametrize("i", range(len(POINTS), 5 * len(POINTS)))
def test_soak_crash(i: int, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    crash_scenario(i, tmp_path, request, store="s3" if i % 4 == 0 else "local")


@pytest.mark.soak
@pytest.mark.parametrize("i", range(1, 7))
def test_soak_spark_crash(i: int, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    request.getfixturevalue("spark")
    crash_scenario(i, tmp_path, request, "spark", "s3" if i % 2 else "local")


@pytest.mark.soak
@pytest.mark.parametrize("i", range(1, 7))
def test_soak_rescale(i: int, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    rescale_scenario(i, tmp_path, request, "s3" if i % 2 else "local")
