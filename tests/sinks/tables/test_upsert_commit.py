"""The upsert sink's stages (change writers, the change compactor, the change committer) driven through
checkpoints with a crash at every point a checkpoint passes, and the restore the engine then runs: the table
ends equal to the changes applied in order, every table version is a prefix of the stream ending at a
checkpoint, no staged or merged file is left behind, and restarted checkpoint ids are refused."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sluice.errors import CommitError
from sluice.sink import CommitOutcome
from sluice.sinks.tables import TableLineageError
from sluice.sinks.tables.change_committer import ChangeCommitter
from sluice.sinks.tables.change_writer import ChangeCompactor, ChangeWriter
from sluice.sinks.tables.files import TableFile

from tests.sinks.conftest import Ctx
from tests.sinks.tables.helpers import Target
from tests.sinks.tables.test_upsert_merge import (
    data_files_on_storage,
    replaced_merge_files,
    staged_left,
    versions_states,
)
from tests.sinks.tables.upserts import Change, Upserts, apply_in_order, as_table, random_stream

CHECKPOINTS = 4


class Crash(Exception):
    pass


@dataclass
class GCtx:
    """A GlobalCommitterContext that crashes once at ``crash_at``."""

    restored_checkpoint_id: int | None
    attempt: int
    crash_at: str | None = None
    job_id: str = "job"
    sink_uid: str = "sink"
    metrics: dict[str, int] = field(default_factory=dict)

    def metric(self, name: str, increment: int = 1) -> None:
        self.metrics[name] = self.metrics.get(name, 0) + increment

    def fault_hook(self, point: str) -> None:
        if point == self.crash_at:
            self.crash_at = None
            raise Crash(point)


@dataclass
class Job:
    """The engine's side, reduced to what a sink sees: checkpoints, their committables, restores."""

    up: Upserts
    stream: list[list[Change]]
    completed: dict[int, list[TableFile]] = field(default_factory=dict)  # checkpoint -> its global committables
    attempt: int = 0

    def storage(self, schema: Any = None) -> Any:
        return self.up.fs()

    def run(self, crash: tuple[int, str, int] | None) -> None:
        """Run every checkpoint; on a crash, restart from the newest completed checkpoint."""
        while True:
            try:
                self._attempt(crash)
                return
            except (Crash, CommitError) as exc:
                assert isinstance(exc, Crash) or isinstance(exc.__cause__, Crash), exc
                crash = None
                self.attempt += 1

    def _attempt(self, crash: tuple[int, str, int] | None) -> None:
        restored = max(self.completed, default=None)
        at = crash[1] if crash else None
        gctx = GCtx(restored, self.attempt)
        committer = ChangeCommitter(
            "test", self.up.engine, self.storage, self.up.keys, gctx,
            remove_orphans=getattr(self.up.engine, "remove_orphans", None),
        )
        if restored is not None:  # the restored checkpoint's committables are committed again first
            assert committer.commit(restored, self.completed[restored]) in (
                CommitOutcome.COMMITTED, CommitOutcome.ALREADY_COMMITTED)
        for cid in range((restored or 0) + 1, len(self.stream) + 1):
            armed = crash is not None and crash[0] == cid
            ctx = Ctx(attempt=self.attempt, fault_at=at if armed and at == "compaction" else None,
                      fault_after=crash[2] if armed and crash else 0)
            writers = [ChangeWriter(self.storage, self.up.keys, Ctx(subtask=s, attempt=self.attempt), collapse_rows=10)
                       for s in range(2)]
            for i, c in enumerate(self.stream[cid - 1]):  # the source re-reads a checkpoint's changes after a restore
                writers[i % 2].write(as_table([c]).to_batches()[0])
            staged = [f for w in writers for f in w.prepare_commit(cid)]
            try:
                files = ChangeCompactor(self.storage, self.up.keys, ctx).compact(cid, staged)
            except RuntimeError as exc:  # Ctx raises RuntimeError("crash at ...")
                raise Crash(str(exc)) from exc
            self.completed[cid] = files  # the checkpoint's metadata is written: it completed
            if armed and at in ("table_commit", "commit"):
                gctx.crash_at = at
            committer.commit(cid, files)


@pytest.mark.parametrize(
    "crash",
    [None, (3, "compaction", 0), (3, "compaction", 1), (3, "table_commit", 0), (3, "commit", 0), (1, "table_commit", 0)],
    ids=["no-crash", "compaction-before-merge", "compaction-after-merge", "before-table-commit", "after-table-commit",
         "first-commit"],
)
def test_a_crash_at_every_point_of_a_checkpoint_loses_and_doubles_no_change(
    local_target: Target, crash: tuple[int, str, int] | None
) -> None:
    rng = random.Random(17)
    stream = [random_stream(rng, 70, 25, cid * 1000) for cid in range(1, CHECKPOINTS + 1)]
    up = Upserts(local_target)
    job = Job(up, stream)
    job.run(crash)
    if crash is not None:
        assert job.attempt == 1, "the fault never fired"
    ref: dict[int, Any] = {}
    prefixes: list[dict[int, Any]] = [{}]
    for changes in stream:
        apply_in_order(ref, changes)
        prefixes.append(dict(ref))
    assert up.state() == ref
    assert all(s in prefixes for s in versions_states(local_target)), "a table version is no checkpoint's prefix"
    assert staged_left(up) == [], "staged change files outlived their commit"
    if local_target.kind == "iceberg":
        merged = {Path(p).name for p in data_files_on_storage(local_target) if Path(p).name.startswith("merge-")}
        assert merged <= replaced_merge_files(local_target), "a merge's files outlived its failed commit"


def test_restarted_checkpoint_ids_are_refused_instead_of_skipping_changes(local_target: Target) -> None:
    up = Upserts(local_target)
    up.checkpoint(5, random_stream(random.Random(1), 20, 5))
    fresh = ChangeCommitter("test", up.engine, up.fs, up.keys, GCtx(None, 0))  # ids started again at 1
    files = [up.stage(3, as_table(random_stream(random.Random(2), 20, 5, 100)))]
    with pytest.raises(TableLineageError, match="checkpoint ids restarted"):
        fresh.commit(3, files)
    assert staged_left(up), "the refused checkpoint's changes were deleted"


def test_a_checkpoint_without_changes_commits_nothing(local_target: Target) -> None:
    up = Upserts(local_target)
    committer = ChangeCommitter("test", up.engine, up.fs, up.keys, GCtx(None, 0))
    assert committer.commit(1, []) is CommitOutcome.COMMITTED
    assert not local_target.exists()



def test_a_file_a_failed_attempt_stages_after_the_first_sweep_is_deleted_at_the_next_merge(
    local_target: Target,
) -> None:
    """A failed attempt's compactor can still be merging (the asynchronous part of its checkpoint outlives
    the attempt) when the next attempt's committer sweeps orphans: its file lands after that sweep. The next
    merge deletes it; the current attempt's file of a checkpoint not yet merged stays."""
    from sluice.sinks.tables.changes import stage_changes
    from sluice.sinks.tables.files import data_file_name

    up = Upserts(local_target)
    up.checkpoint(1, random_stream(random.Random(1), 20, 5))
    committer = ChangeCommitter("test", up.engine, up.fs, up.keys, GCtx(1, 1))  # attempt 1 restored 1
    fs, root = up.fs()
    changes = as_table(random_stream(random.Random(2), 20, 5, 100))
    late = stage_changes(fs, root, data_file_name("job", 2, 2, 0, 1, "0123456789ab", compacted=True), changes, 2)
    assert (Path(root) / late.path).exists()
    pending = stage_changes(fs, root, data_file_name("job", 4, 0, 1, 0, "0123456789ab"), changes, 4)
    assert committer.commit(3, [up.stage(3, changes)]) is CommitOutcome.COMMITTED
    left = [Path(p).name for p in staged_left(up)]
    assert left == [Path(pending.path).name], "a failed attempt's late staged file survived the next merge"
