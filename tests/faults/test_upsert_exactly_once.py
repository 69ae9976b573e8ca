"""Upserts exactly once: a change stream (inserts, updates, deletes and snapshot reads of a few keys, many
changes per key, several in one checkpoint) into a DeltaSink and an IcebergSink in ``mode="upsert"``, with a
crash at every point a checkpoint passes, a restore, a rescale; on the in-process and the Spark runtime, on
a local folder and on moto's S3.

Each scenario compares the table with a reference computed apart from the sink (tests/sinks/tables/cdc.py: the
whole stream applied to a dict in source order) and reads back every table version: each is the stream
applied up to a cut of per-split prefixes (a checkpoint's source offsets), and the checkpoint ids the
versions record strictly increase (none applied twice). Faults count only when they fired; staged change
files never outlive the job. The default run is a fast slice; ``-m soak`` runs more.
"""

from __future__ import annotations

import functools
import random
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
from sluice.sinks.tables.changes import CHANGES_DIR
from sluice.sinks.tables.storage import arrow_filesystem
from sluice.testing.faults import FaultInjector, HitCounter, PlannedFault

from tests.faults.plans import _first
from tests.faults.shapes import record
from tests.sinks.tables.cdc import PlainStream, Stream, check_versions, pipeline, table_state, version_states
from tests.sinks.tables.conftest import s3_target_of
from tests.sinks.tables.helpers import Target, completed

SINKS = ("delta", "iceberg")
#: the points a checkpoint of an upsert job passes: while writing, while (asynchronously) merging the
#: writers' staged files, between snapshot and ack, between completion and the merge, with the merge landed
#: but not yet known, after it before the notification, at the final checkpoint
POINTS = (
    "process", "source", "snapshot_to_ack", "compaction", "global_commit", "commit", "complete_to_commit",
    "final_checkpoint",
)
STREAM = Stream(splits=3, per_split=240, batch=20)
RATE = 400.0  # changes per second per reader: the job runs over several checkpoints


def target_of(sink: str, store: str, tmp: Path, request: pytest.FixtureRequest) -> Target:
    if store == "s3":
        return s3_target_of(sink, request.getfixturevalue("moto_s3"), str(tmp))
    return Target(sink, str(tmp / "lake"), {}, str(tmp))


def run(
    target: Target, tmp: Path, faults: Any, *, runtime: str = "local", parallelism: int = 2, attempts: int = 6,
    restore: str = "none", source: Any = None, **sink: Any,
) -> Any:
    """``source``: another source of STREAM's changes (default: the stream at ``RATE``)."""
    p = pipeline(STREAM, target.sink(mode="upsert", **sink), str(tmp), parallelism=parallelism, rate=RATE,
                 attempts=attempts, source=source)
    try:
        return p.run(runtime=runtime, faults=faults, restore=restore)
    except Exception as exc:  # the run's error is asserted by the caller
        return exc


@functools.cache
def hits(sink: str) -> dict[str, int]:
    """Hits per fault point of a failure-free run into ``sink`` (whose table must equal the reference)."""
    import tempfile

    counter = HitCounter()
    with tempfile.TemporaryDirectory(prefix=f"sluice-upsert-hits-{sink}-") as d:
        target = Target(sink, f"{d}/lake", {}, d)
        result = run(target, Path(d), counter)
        assert not isinstance(result, Exception), result
        assert table_state(target.read()) == STREAM.final(), f"a failure-free run into {sink} differs"
    return dict(counter.hits)


def staged_left(target: Target) -> list[str]:
    """Staged change files still on storage."""
    fs, root = arrow_filesystem(target.root, target.storage_options)
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    return [i.path for i in infos if i.type == pafs.FileType.File and f"/{CHANGES_DIR}/" in i.path]


def check(
    label: str, target: Target, result: Any, fired: bool, crashes: int, family: str, scenario: Any, one_run: bool = True,
    stream: Stream = STREAM,
) -> None:
    """The table equals the reference, every version is a checkpoint's cut, no checkpoint applied twice (and,
    if ``one_run`` wrote the table, at most one merge per completed checkpoint)."""
    expected = stream.final()
    got = table_state(target.read()) if target.exists() else {}
    record(family, scenario, "cdc", target.kind, fired, crashes, sorted(got.items()), sorted(expected.items()))
    assert not isinstance(result, Exception), f"{label}: {result}"
    assert fired, f"{label}: armed faults did not fire"
    assert got == expected, f"{label}: the table differs from the change stream applied in order"
    check_versions(stream, target)
    recorded = [cid for cid, _ in version_states(target) if cid is not None]
    assert recorded == sorted(set(recorded)), f"{label}: a checkpoint was applied twice: {recorded}"
    if one_run:
        assert len(recorded) <= completed(result), f"{label}: {len(recorded)} merges, {completed(result)} checkpoints"
    assert staged_left(target) == [], f"{label}: staged change files were left behind"


def crash_scenario(sink: str, i: int, tmp: Path, request: pytest.FixtureRequest, runtime: str = "local",
                   store: str = "local") -> None:
    point = POINTS[i % len(POINTS)]
    rng = random.Random(1000 + i)
    count = hits(sink).get(point, 0)
    assert count > 0, f"a failure-free run into {sink} never reached {point}"
    # ``process`` counts the data batches that reach the sink's tasks, and how many there are depends on how
    # the exchange batched them and on how many checkpoints the run took (a loaded machine: fewer, larger
    # ones): armed at hit 8 of a failure-free run's count, a soak case once saw fewer. The first hit is
    # reached by every run; later crashes in the stream are drawn at ``source``, whose count is the input's
    plan = [PlannedFault(point, 0) if point == "process" else _first(rng, point, count)]
    if i % 3 == 2 and point in ("global_commit", "commit", "complete_to_commit", "final_checkpoint"):
        plan.append(PlannedFault("restore", 0))  # and again while restoring from that crash
    faults = FaultInjector(plan=plan)
    target = target_of(sink, store, tmp, request)
    bucketed = {"partition_by": ["bucket(4, id)"]} if sink == "iceberg" and i % 2 else {}
    result = run(target, tmp, faults, runtime=runtime, parallelism=rng.choice([1, 2, 3]), **bucketed)
    label = f"upsert into {sink} on {runtime}/{store}, plan={plan}, fired={faults.fired}"
    check(label, target, result, faults.all_fired, faults.crashes, f"upsert-{sink}", i)


#: every point once per sink in the default run, the sinks taking turns, and the other turn in ``-m soak``
EVERY_POINT = [pytest.param(SINKS[(i + n) % 2], i, id=f"{i}-{SINKS[(i + n) % 2]}",
                            marks=[pytest.mark.soak] if n else [])
               for n in (0, 1) for i in range(len(POINTS))]  # fmt: skip


@pytest.mark.faults
@pytest.mark.parametrize(("sink", "i"), EVERY_POINT)
def test_a_crash_at_every_point_loses_and_doubles_no_change(sink: str, i: int, tmp_path: Path,
                                                            request: pytest.FixtureRequest) -> None:
    crash_scenario(sink, i, tmp_path, request)


CASES = [("delta", "spark", "local", 2), ("iceberg", "spark", "s3", 6), ("delta", "local", "s3", 5),
         ("iceberg", "local", "s3", 3)]


@pytest.mark.faults
@pytest.mark.parametrize(("sink", "runtime", "store", "i"), CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_crashes_on_spark_and_on_s3(sink: str, runtime: str, store: str, i: int, tmp_path: Path,
                                    request: pytest.FixtureRequest) -> None:
    if runtime == "spark":
        request.getfixturevalue("spark")
    crash_scenario(sink, i, tmp_path, request, runtime, store)


#: plain rows (no change columns) upserting their key: the sink at another parallelism than the source, so
#: the rows cross the hash exchange on the key columns; points while writing, between snapshot and ack, at
#: and after the merge
PLAIN = PlainStream(splits=3, per_split=480, batch=8)
PLAIN_POINTS = ("process", "global_commit", "snapshot_to_ack", "complete_to_commit")


def plain_scenario(sink: str, i: int, tmp: Path) -> None:
    point = PLAIN_POINTS[i % len(PLAIN_POINTS)]
    rng = random.Random(3000 + i)
    faults = FaultInjector(point=point, after=rng.randint(0, 2))
    target = Target(sink, str(tmp / "lake"), {}, str(tmp))
    source_par = rng.choice([1, 2, 3])
    p = pipeline(PLAIN, target.sink(mode="upsert", key_columns=["id"]), str(tmp), parallelism=source_par,
                 sink_parallelism=1 + source_par % 3, rate=2 * RATE)
    try:
        result = p.run(runtime="local", faults=faults, restore="none")
    except Exception as exc:  # asserted by check
        result = exc
    label = f"plain rows upserted into {sink}, crash at {point}, fired={faults.fired}"
    check(label, target, result, faults.all_fired, faults.crashes, f"upsert-plain-{sink}", i, stream=PLAIN)


@pytest.mark.faults
@pytest.mark.parametrize(("sink", "i"), [pytest.param(SINKS[i % 2], i, id=f"{i}-{SINKS[i % 2]}",
                                                      marks=[pytest.mark.soak] if i >= 2 else [])
                                         for i in range(2 * len(PLAIN_POINTS))])  # fmt: skip
def test_plain_rows_upserted_with_a_crash_lose_and_double_no_row(sink: str, i: int, tmp_path: Path) -> None:
    plain_scenario(sink, i, tmp_path)


def rescale_scenario(sink: str, i: int, tmp: Path, request: pytest.FixtureRequest, store: str = "local") -> None:
    """A crash ends the first run (no restart); a second run restores its latest checkpoint at another
    parallelism and finishes the stream."""
    rng = random.Random(2000 + i)
    target = target_of(sink, store, tmp, request)
    point = rng.choice(["complete_to_commit", "commit", "global_commit"])
    faults = FaultInjector(point=point, after=rng.randint(0, 1))
    first = run(target, tmp, faults, parallelism=rng.choice([1, 2]), attempts=0)
    assert isinstance(first, Exception) and faults.all_fired, f"{sink}: the first run did not crash at {point}"
    check_versions(STREAM, target)  # what the crashed run committed is a checkpoint's cut too
    second = run(target, tmp, None, parallelism=3, restore="latest")
    check(f"upsert into {sink}: crash at {point}, restore rescaled", target, second, True, 1, "upsert-rescale", i, False)


@pytest.mark.faults
@pytest.mark.parametrize("sink", SINKS)
def test_a_crash_then_a_restore_at_another_parallelism(sink: str, tmp_path: Path,
                                                       request: pytest.FixtureRequest) -> None:
    rescale_scenario(sink, 0, tmp_path, request)


@pytest.mark.soak
@pytest.mark.parametrize("sink", SINKS)
@pytest.mark.parametrize("i", range(len(POINTS), 6 * len(POINTS)))
def test_soak_crash(sink: str, i: int, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    crash_scenario(sink, i, tmp_path, request, store="s3" if i % 4 == 0 else "local")


@pytest.mark.soak
@pytest.mark.parametrize("sink", SINKS)
@pytest.mark.parametrize("i", range(1, 9))
def test_soak_spark_crash(sink: str, i: int, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    request.getfixturevalue("spark")
    crash_scenario(sink, i, tmp_path, request, "spark", "s3" if i % 2 else "local")


@pytest.mark.soak
@pytest.mark.parametrize("sink", SINKS)
@pytest.mark.parametrize("i", range(1, 9))
def test_soak_rescale(sink: str, i: int, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    rescale_scenario(sink, i, tmp_path, request, "s3" if i % 2 else "local")
