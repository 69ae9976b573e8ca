"""The background rewrite: older small files merged by a commit of their own (Delta optimize, an Iceberg
overwrite snapshot), atomically for readers, racing the sink's checkpoint commits without ever losing or
duplicating a row."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from sluice.sink import CommitOutcome
from sluice.sinks.tables import RewritePolicy

from tests import listing
from tests.sinks.tables.helpers import Target, completed, ids
from tests.sinks.tables.paced import Paced
from tests.sinks.tables.test_commits import GCtx, precommit
from tests.sinks.tables.test_table_sinks import run_job


def rewrite_now(target: Target, sink: object, policy: RewritePolicy) -> int:
    if target.kind == "delta":
        from sluice.sinks.delta.rewrite import rewrite_small_files

        return rewrite_small_files(sink.options, policy)  # type: ignore[attr-defined]
    from sluice.sinks.iceberg.rewrite import rewrite_small_files as iceberg_rewrite

    return iceberg_rewrite(sink.options, policy, threading.Lock())  # type: ignore[attr-defined]


def test_a_job_with_background_rewrite_keeps_every_row_once(local_target: Target, tmp_path: Path) -> None:
    """Each reader's 2 x 2000 rows come in 8 chunks, each in a checkpoint of its own (on a loaded machine a
    rate-limited source used to fit in 5 checkpoints, too few for ``min_files=3``), and the input ends only
    once a rewrite committed."""
    policy = RewritePolicy(every=2, min_files=3, target_size=16 * 1024 * 1024)
    src = Paced(num_splits=4, records_per_split=2000, batch_size=50, chunk_batches=10, until=local_target.rewrote)
    src, result = run_job(local_target, tmp_path, src=src, rewrite=policy)
    assert ids(local_target.read()) == ids(src.expected())
    assert ids(local_target.read_independently()) == ids(src.expected())
    n = completed(result)
    assert n >= 8, f"only {n} checkpoints: the source's chunks did not land in checkpoints of their own"
    assert local_target.rewrites() >= 1, result.metrics
    assert "rewrite_failures" not in result.metrics, result.metrics
    assert max(local_target.files_per_partition().values()) < n


def test_rewrite_racing_checkpoint_commits(local_target: Target) -> None:
    """A rewrite thread merges while checkpoint commits keep appending: every row exactly once, at every
    version a reader may read."""
    sink = local_target.sink(partition_by=["b"])
    committer = sink.create_global_committer(GCtx())
    for cid in range(1, 7):
        committer.commit(cid, precommit(sink, cid, cid * 100))
    policy = RewritePolicy(every=1, min_files=3, target_size=16 * 1024 * 1024)
    done: list[int] = []
    errors: list[BaseException] = []

    def rewrite() -> None:
        try:
            for _ in range(3):
                done.append(rewrite_now(local_target, sink, policy))
        except BaseException as exc:
            errors.append(exc)

    th = threading.Thread(target=rewrite)
    th.start()
    seen: list[list[int]] = []
    for cid in range(7, 13):
        committer.commit(cid, precommit(sink, cid, cid * 100))
        seen.append(ids(local_target.read()))
    th.join()
    assert not errors, errors
    assert sum(done) >= 3, f"the rewrite replaced {done} files"
    expected = sorted(i for cid in range(1, 13) for i in range(cid * 100, cid * 100 + 10))
    assert ids(local_target.read()) == expected
    for k, rows in enumerate(seen):  # every read saw whole checkpoints, no row twice
        assert rows == sorted(i for cid in range(1, 8 + k) for i in range(cid * 100, cid * 100 + 10)), k
    assert max(local_target.files_per_partition().values()) < 12


def test_a_rewrite_round_commits_once_per_partition_it_merges(local_target: Target) -> None:
    """What docs/tables.md says: each partition a round merges is replaced by a commit of its own."""
    sink = local_target.sink(partition_by=["b"])
    committer = sink.create_global_committer(GCtx())
    for cid in range(1, 5):
        committer.commit(cid, precommit(sink, cid, cid * 100))  # a file in each of partitions b=0, b=1
    versions = local_target.versions()
    replaced = rewrite_now(local_target, sink, RewritePolicy(every=1, min_files=3, target_size=16 * 1024 * 1024))
    assert replaced == 8 and local_target.versions() == versions + 2, (replaced, local_target.versions())
    assert local_target.files_per_partition() == {p: 1 for p in local_target.files_per_partition()}
    assert ids(local_target.read()) == sorted(i for cid in range(1, 5) for i in range(cid * 100, cid * 100 + 10))


def test_an_iceberg_rewrite_whose_files_a_merge_replaced_takes_its_turn_holding_the_lock(tmp_path: Path) -> None:
    """In upsert mode each checkpoint's merge replaces the small files holding changed keys, so a rewrite
    planned before it used to give up, round after round (starved by 30 ms checkpoints). Now its merged file
    is deleted and the partition is merged again holding the commit lock, which the next merge waits for."""
    from sluice.sinks.iceberg.rewrite import rewrite_small_files
    from sluice.sinks.tables.changes import Op

    from tests.sinks.tables.test_upsert_iceberg import iceberg, upserts
    from tests.sinks.tables.upserts import Change, apply_in_order

    up = iceberg(tmp_path)
    ref: dict[int, tuple[str | None, float | None]] = {}
    for cid in range(1, 5):  # four small files: keys 100-109, 200-209, 300-309, 400-409
        up.checkpoint(cid, upserts(range(cid * 100, cid * 100 + 10), cid * 1000))
        apply_in_order(ref, upserts(range(cid * 100, cid * 100 + 10), cid * 1000))
    sink = up.target.sink(mode="upsert", key_columns=["id"])
    lock = threading.Lock()
    data = tmp_path / "lake" / "warehouse" / "db" / "events" / "data"
    done: list[int] = []
    errors: list[BaseException] = []

    def rewrite() -> None:
        try:
            done.append(rewrite_small_files(sink.options, RewritePolicy(1, 2, 1 << 20), lock))  # type: ignore[attr-defined]
        except BaseException as exc:
            errors.append(exc)

    with lock:  # the committer's lock: the rewrite merges, then waits here to swap
        th = threading.Thread(target=rewrite)
        th.start()
        deadline = time.monotonic() + 120
        while not listing.file_paths(data, "rewrite-*.parquet"):  # listed while the rewrite writes there
            assert th.is_alive() and time.monotonic() < deadline, (done, errors)
            time.sleep(0.01)
        change = Change(205, Op.UPDATE, "moved on", -1.0, 9000)  # replaces the file of keys 200-209
        assert up.checkpoint(5, [change]) is CommitOutcome.COMMITTED
        apply_in_order(ref, [change])
    th.join(120)
    assert not errors and done == [4], (done, errors)  # the three untouched files and the merge's replacement
    snaps = up.target.iceberg_table().snapshots()
    assert sum(1 for s in snaps if s.summary and "sluice.rewrite" in s.summary.additional_properties) == 1
    assert up.state() == ref
    assert len(up.target.files()) == 1
    assert len(listing.file_paths(data, "rewrite-*.parquet")) == 1, "the stale merged file was left behind"
