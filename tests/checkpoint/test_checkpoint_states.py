"""The coordinator's small state machines: acknowledgement results, checkpoint statuses, and which failure
reasons count toward ``tolerable_failed_checkpoints`` (a real coordinator over local storage)."""

from __future__ import annotations

import json

import pytest
from sluice import CheckpointConfig, CheckpointError, CheckpointFailureReason
from sluice.checkpoint.coordinator import (
    AckResult,
    CheckpointCoordinator,
    CoordinatedTasks,
    CoordinatorServices,
)
from sluice.checkpoint.stats import CheckpointStats, CheckpointStatus
from sluice.checkpoint.storage_loader import checkpoint_storage
from sluice.errors import IllegalTransitionError
from sluice.events import CheckpointBarrier
from sluice.graph import SubtaskId

A, B = SubtaskId(0, 0), SubtaskId(0, 1)


class Handle:
    def __init__(self) -> None:
        self.triggered: list[int] = []
        self.completed: list[int] = []
        self.aborted: list[int] = []

    def trigger_checkpoint(self, barrier: CheckpointBarrier) -> None:
        self.triggered.append(barrier.checkpoint_id)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.completed.append(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self.aborted.append(checkpoint_id)


def coordinator(
    tmp_path, tolerable: int = 0, concurrent: int = 1, history_size: int = 100
) -> tuple[CheckpointCoordinator, list[BaseException]]:
    cfg = CheckpointConfig(
        interval=None,
        storage=str(tmp_path),
        tolerable_failed_checkpoints=tolerable,
        max_concurrent=concurrent,
        history_size=history_size,
    )
    fatal: list[BaseException] = []
    c = CheckpointCoordinator(
        cfg,
        CoordinatedTasks({A: Handle(), B: Handle()}, {A, B}),
        CoordinatorServices(checkpoint_storage(str(tmp_path), "job"), {"job_id": "job"}, on_fatal=fatal.append),
    )
    return c, fatal


def trigger(c: CheckpointCoordinator) -> int:
    cid = c._try_trigger(forced=True)
    assert cid is not None
    return cid


def test_acknowledgements_return_a_result_and_never_raise(tmp_path) -> None:
    c, fatal = coordinator(tmp_path)
    assert c.acknowledge(A, 1, {}) is AckResult.UNKNOWN
    cid = trigger(c)
    assert c.acknowledge(A, cid, {}) is AckResult.SUCCESS
    assert c.acknowledge(A, cid, {}) is AckResult.DUPLICATE
    assert c.acknowledge(B, cid, {}) is AckResult.SUCCESS
    assert c.acknowledge(B, cid, {}) is AckResult.DISCARDED  # completed: no longer pending
    assert [s.status for s in c.history] == [CheckpointStatus.COMPLETED] and not fatal


def test_statuses_are_written_as_their_json_values(tmp_path) -> None:
    c, _ = coordinator(tmp_path, tolerable=5)
    done = trigger(c)
    c.acknowledge(A, done, {})
    c.acknowledge(B, done, {})
    failed = trigger(c)
    c.decline(A, failed, "disk full")
    rows = [json.loads(line) for line in (tmp_path / "job" / "_stats" / "0000000000.jsonl").read_text().splitlines()]
    assert [(r["checkpoint_id"], r["status"], r["failure_reason"]) for r in rows] == [
        (done, "completed", None),
        (failed, "failed", "DECLINED"),
    ]
    assert c.history[-1].status == "failed" and c.history[-1].failure_detail == "disk full"


@pytest.mark.parametrize("reason", list(CheckpointFailureReason))
def test_only_failures_that_say_something_about_the_job_count_toward_the_tolerable_limit(
    tmp_path, reason: CheckpointFailureReason
) -> None:
    c, fatal = coordinator(tmp_path, tolerable=0)
    cid = trigger(c)
    c._abort(cid, reason, "test")
    counts = reason in (
        CheckpointFailureReason.EXPIRED,
        CheckpointFailureReason.DECLINED,
        CheckpointFailureReason.STORAGE_FAILURE,
    )
    assert reason.counts_toward_tolerable is counts
    assert c.failures.consecutive == int(counts)
    assert [type(e) for e in fatal] == ([CheckpointError] if counts else [])
    assert c.history[-1].status is CheckpointStatus.FAILED and c.history[-1].failure_reason == reason.name


def test_subsumed_and_stopped_checkpoints_do_not_fail_the_job(tmp_path) -> None:
    c, fatal = coordinator(tmp_path, tolerable=0, concurrent=3)
    first, second, third = trigger(c), trigger(c), trigger(c)
    c.acknowledge(A, second, {})
    c.acknowledge(B, second, {})  # completes: the first is subsumed
    c.stop(CheckpointFailureReason.JOB_FAILOVER)  # the third ends with the attempt
    by_id = {s.checkpoint_id: s for s in c.history}
    assert by_id[first].failure_reason == "SUBSUMED" and by_id[third].failure_reason == "JOB_FAILOVER"
    assert by_id[second].status is CheckpointStatus.COMPLETED
    assert not fatal and c.failures.consecutive == 0


def test_the_history_keeps_the_newest_checkpoints_and_the_totals_count_all(tmp_path) -> None:
    c, _ = coordinator(tmp_path, tolerable=5, history_size=3)
    failed = trigger(c)
    c.decline(A, failed, "disk full")
    for _ in range(9):
        done = trigger(c)
        c.acknowledge(A, done, {})
        c.acknowledge(B, done, {})
    assert [s.checkpoint_id for s in c.history] == [done - 2, done - 1, done]
    counts = c.stats.counts
    assert (counts.completed, counts.failed, c.stats.in_progress) == (9, 1, 0)
    assert counts.duration_buckets[-1] == 9 and counts.duration_s_sum >= 0
    latest = c.stats.latest_failed
    assert latest is not None and latest.checkpoint_id == failed and latest.failure_detail == "disk full"
    trigger(c)
    assert c.stats.in_progress == 1


def test_a_checkpoint_completes_or_fails_once() -> None:
    s = CheckpointStats(7, CheckpointStatus.IN_PROGRESS, 0.0)
    s.finish(CheckpointStatus.COMPLETED)
    with pytest.raises(IllegalTransitionError, match="checkpoint 7: cannot go from completed to failed"):
        s.finish(CheckpointStatus.FAILED)
    with pytest.raises(IllegalTransitionError, match="in_progress to in_progress"):
        CheckpointStats(8, CheckpointStatus.IN_PROGRESS, 0.0).finish(CheckpointStatus.IN_PROGRESS)
