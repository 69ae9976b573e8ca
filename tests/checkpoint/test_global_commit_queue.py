"""Global commits run on their own ordered thread, never on the coordinator's completion path.

The invariants of ``sluice.checkpoint.global_commit``: commits in checkpoint order; a slow commit does not
hold checkpoints back; committables whose commit has not returned are recorded by every later checkpoint,
so a restore of any of them commits them again, in order, exactly once; a finished job has committed all.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from sluice import CheckpointConfig, FixedDelayRestart, Pipeline
from sluice.checkpoint.global_commit import GlobalCommitQueue
from sluice.checkpoint.storage_loader import checkpoint_storage
from sluice.connectors.generator import GeneratorSource
from sluice.sink import CommitOutcome, GlobalCommitter, GlobalCommitterContext
from sluice.sinks.testing import TwoPhaseCommitTestSink, read_committed
from sluice.testing.faults import InjectedFault

DEADLINE = 120.0  # generous: these waits end on a condition, never on a duration


def wait_for(condition: Any, what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_commits_in_order_and_uncommitted_until_returned() -> None:
    release = threading.Event()
    done: list[tuple[str, int, list[Any]]] = []

    def commit(uid: str) -> Any:
        def run(cid: int, comms: list[Any]) -> None:
            release.wait(DEADLINE)
            done.append((uid, cid, comms))

        return run

    q = GlobalCommitQueue({"a": commit("a"), "b": commit("b")}, on_fatal=lambda e: None)
    q.submit(3, {"a": ["a3"], "b": []})
    q.submit(4, {"a": ["a4"], "b": ["b4"]})
    assert q.uncommitted() == {"a": [(3, ["a3"]), (4, ["a4"])], "b": [(4, ["b4"])]}
    assert not q.drain(timeout=0.05)
    release.set()
    assert q.drain()
    assert done == [("a", 3, ["a3"]), ("b", 3, []), ("a", 4, ["a4"]), ("b", 4, ["b4"])]
    assert q.uncommitted() == {}
    q.close()


def test_a_failed_commit_stops_the_queue_and_is_reported() -> None:
    errors: list[BaseException] = []
    calls: list[int] = []

    def commit(cid: int, comms: list[Any]) -> None:
        calls.append(cid)
        if cid == 2:
            raise RuntimeError("table refused")

    q = GlobalCommitQueue({"t": commit}, on_fatal=errors.append)
    for cid in (1, 2, 3):
        q.submit(cid, {"t": [cid]})
    q.drain()
    q.close()
    assert calls == [1, 2] and [str(e) for e in errors] == ["table refused"]
    assert q.uncommitted() == {"t": [(2, [2]), (3, [3])]}  # still owed: a restore commits them


class _HeldCommits(TwoPhaseCommitTestSink):
    """A global test sink whose first commit of attempt 0 waits for ``later`` more completed checkpoints,
    then crashes the driver's commit (``crash``) or goes on; every commit is logged with its attempt."""

    def __init__(self, directory: str, chk: str, job: str, later: int, crash: bool) -> None:
        super().__init__(directory, global_commit=True)
        self.chk, self.job, self.later, self.crash = chk, job, later, crash
        self.log: list[tuple[int, int, int]] = []  # (attempt, checkpoint id, committables)

    def create_global_committer(self, ctx: GlobalCommitterContext) -> GlobalCommitter[str] | None:
        inner = super().create_global_committer(ctx)
        assert inner is not None
        sink = self

        class Held(GlobalCommitter[str]):
            def commit(self, checkpoint_id: int, committables: Sequence[str]) -> CommitOutcome:
                if ctx.attempt == 0 and not sink.log:
                    storage = checkpoint_storage(sink.chk, sink.job)
                    wait_for(
                        lambda: sum(1 for c, _, _ in storage.completed() if c > checkpoint_id) >= sink.later,
                        f"{sink.later} checkpoints after {checkpoint_id} to complete while its commit waits",
                    )
                    if sink.crash:
                        sink.log.append((ctx.attempt, checkpoint_id, -1))
                        raise InjectedFault(f"driver crash in the commit of checkpoint {checkpoint_id}")
                sink.log.append((ctx.attempt, checkpoint_id, len(committables)))
                return inner.commit(checkpoint_id, committables)

        return Held()


def _job(tmp: Any, sink: TwoPhaseCommitTestSink) -> Pipeline:
    p = Pipeline(
        "held-commits",
        parallelism=2,
        checkpoint=CheckpointConfig(interval=0.05, storage=str(tmp / "chk"), num_retained=10),
        restart=FixedDelayRestart(attempts=2, delay=0.0),
    )
    src = GeneratorSource(num_splits=2, records_per_split=3000, batch_size=20, rows_per_second=4000)
    p.source(src).sink(sink)
    return p


def test_a_slow_commit_does_not_hold_checkpoints_back(tmp_path: Any) -> None:
    """While the first commit waits, three later checkpoints complete (on the coordinator it deadlocked)."""
    sink = _HeldCommits(str(tmp_path / "out"), str(tmp_path / "chk"), "held-commits", later=3, crash=False)
    result = _job(tmp_path, sink).run(runtime="local", restore="none")
    assert result.status == "finished" and result.attempts == 1
    ids = [cid for _, cid, _ in sink.log]
    assert ids == sorted(ids) and len(ids) == len(set(ids)), f"commits out of order: {ids}"
    table = read_committed(str(tmp_path / "out"))
    assert table is not None and sorted(table.column("id").to_pylist()) == list(range(6000))


def test_commits_still_queued_at_a_crash_are_committed_by_the_restore_in_order(tmp_path: Any) -> None:
    """The driver crashes in a commit while later checkpoints completed: the restore of the latest one
    commits the crashed checkpoint and every later one, in order, and nothing twice."""
    sink = _HeldCommits(str(tmp_path / "out"), str(tmp_path / "chk"), "held-commits", later=2, crash=True)
    result = _job(tmp_path, sink).run(runtime="local", restore="none")
    assert result.status == "finished" and result.attempts == 2, result.failures
    crashed = [cid for a, cid, n in sink.log if a == 0 and n == -1]
    assert len(crashed) == 1
    recommitted = [cid for a, cid, _ in sink.log if a == 1]
    assert recommitted[0] == crashed[0], f"the restore did not start with the crashed commit: {sink.log}"
    assert recommitted == sorted(recommitted)
    table = read_committed(str(tmp_path / "out"))
    assert table is not None
    ids = sorted(table.column("id").to_pylist())
    assert ids == list(range(6000)), f"{len(ids)} rows, {len(ids) - len(set(ids))} duplicated"

