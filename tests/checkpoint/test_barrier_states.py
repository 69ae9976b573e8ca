"""The barrier handler's states and the at-least-once tracker, case by case (randomized: test_barrier_interleavings)."""

from __future__ import annotations

from typing import Any

import pytest
from sluice import ConfigError
from sluice.checkpoint.barrier_tracker import CheckpointBarrierTracker
from sluice.checkpoint.barriers import SingleCheckpointBarrierHandler, barrier_handler
from sluice.errors import CheckpointFailureReason
from sluice.events import AlignmentMode, CheckpointBarrier, CheckpointKind, CheckpointOptions


class Recorder:
    """Both halves a barrier handler acts on (input, checkpointing), recording every call; ``queued`` says which barriers a pull finds (and what they
    overtook)."""

    def __init__(self) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.blocked: set[int] = set()
        self.queued: dict[int, list[str]] = {}
        self.restoring = False  # a channel still owes restored in-flight data

    def block(self, c: int) -> None:
        self.blocked.add(c)

    def unblock_all(self) -> None:
        self.blocked.clear()

    def perform_checkpoint(self, b: CheckpointBarrier, unaligned: bool) -> None:
        self.log.append(("snapshot", b.checkpoint_id, unaligned))

    def start_recording(self, cid: int, channels: set[int], overtaken: dict[int, list[Any]]) -> None:
        self.log.append(("record", cid, sorted(channels), overtaken))

    def stop_recording(self, c: int) -> None:
        self.log.append(("stop", c))

    def add_overtaken(self, cid: int, c: int, batches: list[Any]) -> None:
        self.log.append(("overtaken", cid, c, batches))

    def finish_recording(self, cid: int) -> None:
        self.log.append(("finish", cid))

    def pull_barrier_forward(self, c: int, cid: int) -> list[Any] | None:
        return self.queued.pop(c, None)

    def recovering(self) -> bool:
        return self.restoring

    def abort_checkpoint(
        self, cid: int, reason: str, failure: CheckpointFailureReason = CheckpointFailureReason.DECLINED
    ) -> None:
        self.log.append(("abort", cid) if failure is CheckpointFailureReason.DECLINED else ("abort", cid, failure))

    def alignment_done(self, cid: int, s: float, switched: bool) -> None:
        self.log.append(("done", cid, switched))

    def of(self, kind: str) -> list[tuple[Any, ...]]:
        return [e for e in self.log if e[0] == kind]


def barrier(cid: int, mode: AlignmentMode = AlignmentMode.ALIGNED, ts: float = 0.0, timeout: float | None = None,
            savepoint: bool = False) -> CheckpointBarrier:
    kind = CheckpointKind.SAVEPOINT if savepoint else CheckpointKind.CHECKPOINT
    return CheckpointBarrier(cid, ts, CheckpointOptions(kind, mode, timeout))


@pytest.mark.parametrize(
    ("mode", "impl", "state"),
    [
        (AlignmentMode.ALIGNED, SingleCheckpointBarrierHandler, "WaitingForFirstBarrier"),
        (AlignmentMode.UNALIGNED, SingleCheckpointBarrierHandler, "WaitingForFirstBarrierUnaligned"),
        (AlignmentMode.ADAPTIVE, SingleCheckpointBarrierHandler, "AlternatingWaitingForFirstBarrier"),
        (AlignmentMode.AT_LEAST_ONCE, CheckpointBarrierTracker, "Idle"),
    ],
)
def test_each_mode_gets_its_handler(mode: AlignmentMode, impl: type, state: str) -> None:
    r = Recorder()
    h = barrier_handler(mode, 2, r, r)
    assert type(h) is impl and h.state_name == state and not h.in_progress


def test_at_least_once_is_not_aligned_by_the_single_checkpoint_handler() -> None:
    with pytest.raises(ConfigError, match="CheckpointBarrierTracker"):
        SingleCheckpointBarrierHandler(2, Recorder(), Recorder(), AlignmentMode.AT_LEAST_ONCE)


def test_barrier_of_a_skipped_older_checkpoint_does_not_count_for_the_current_one() -> None:
    """Regression: barrier 1 arriving while checkpoint 2 aligns was counted as channel 1's barrier 2, so
    checkpoint 2 was snapshotted without the data between the two barriers on channel 1."""
    r = Recorder()
    h = SingleCheckpointBarrierHandler.aligned(2, r, r)
    h.on_barrier(0, barrier(2))
    h.on_barrier(1, barrier(1))
    assert r.blocked == {0} and not r.of("snapshot") and h.current == barrier(2)
    h.on_barrier(1, barrier(2))
    assert r.of("snapshot") == [("snapshot", 2, False)] and r.blocked == set()


def test_adaptive_switches_at_the_timeout_and_pulls_queued_barriers_forward() -> None:
    r = Recorder()
    now = [100.0]
    h = barrier_handler(AlignmentMode.ADAPTIVE, 3, r, r, clock=lambda: now[0])
    b = barrier(1, AlignmentMode.ADAPTIVE, ts=100.0, timeout=5.0)
    h.on_announcement(2, b)  # queued behind data on channel 2: the clock runs, nothing is blocked
    assert h.state_name == "AlternatingCollectingBarriers" and r.blocked == set()
    h.on_barrier(0, b)
    assert r.blocked == {0}
    now[0] = 104.9
    h.check_timeout()
    assert not r.of("snapshot")
    r.queued = {2: ["a", "b"]}  # channel 1's barrier is not there yet
    now[0] = 105.0
    h.check_timeout()
    assert r.of("snapshot") == [("snapshot", 1, True)] and r.blocked == set()
    assert r.of("record") == [("record", 1, [1, 2], {2: ["a", "b"]})]
    assert h.state_name == "CollectingBarriersUnaligned"
    h.on_barrier(2, b.as_unaligned(), ["a", "b"])  # the pulled barrier: what it overtook is already state
    h.on_barrier(1, b)
    assert not r.of("overtaken") and r.of("finish") == [("finish", 1)] and r.of("done") == [("done", 1, True)]
    assert h.state_name == "AlternatingWaitingForFirstBarrier"


def test_adaptive_priority_barrier_of_a_switched_upstream_continues_unaligned_here() -> None:
    r = Recorder()
    h = SingleCheckpointBarrierHandler.alternating(2, r, r, clock=lambda: 0.0)
    b = barrier(3, AlignmentMode.ADAPTIVE, timeout=1e9)
    h.on_barrier(0, b)
    h.on_barrier(1, b.as_unaligned(), ["x"])
    assert r.of("snapshot") == [("snapshot", 3, True)] and r.of("record") == [("record", 3, [], {1: ["x"]})]
    assert r.of("done") == [("done", 3, True)] and r.of("finish") == [("finish", 3)]


@pytest.mark.parametrize("mode", [AlignmentMode.UNALIGNED, AlignmentMode.ADAPTIVE, AlignmentMode.AT_LEAST_ONCE])
def test_savepoints_align_in_every_mode_and_never_time_out(mode: AlignmentMode) -> None:
    r = Recorder()
    h = barrier_handler(mode, 2, r, r, clock=lambda: 1e12)
    sp = barrier(5, savepoint=True, timeout=0.0)
    h.on_barrier(1, sp)
    h.check_timeout()
    assert r.blocked == {1} and not r.of("snapshot")
    h.on_barrier(0, sp)
    assert r.of("snapshot") == [("snapshot", 5, False)] and r.blocked == set() and not r.of("record")


def test_cancel_marker_aborts_the_checkpoint_and_is_passed_on_even_if_not_started_here() -> None:
    r = Recorder()
    h = SingleCheckpointBarrierHandler.unaligned(2, r, r)
    h.on_barrier(0, barrier(1, AlignmentMode.UNALIGNED), [])
    h.on_cancel(1, 1)
    h.on_cancel(0, 4)  # never seen here: downstream tasks and the coordinator still hear of it
    h.on_barrier(1, barrier(1, AlignmentMode.UNALIGNED), [])
    h.on_barrier(1, barrier(3, AlignmentMode.UNALIGNED), [])
    assert r.of("abort") == [("abort", 1), ("abort", 4)] and h.last_done == 4 and not h.in_progress
    assert not r.of("finish")


def test_at_least_once_tracks_concurrent_checkpoints_and_a_cancel_aborts_older_ones() -> None:
    r = Recorder()
    h = CheckpointBarrierTracker(2, r, r)
    h.on_barrier(0, barrier(1, AlignmentMode.AT_LEAST_ONCE))
    h.on_barrier(0, barrier(2, AlignmentMode.AT_LEAST_ONCE))
    assert r.blocked == set() and h.current == barrier(1, AlignmentMode.AT_LEAST_ONCE) and h.received == {0}
    h.on_barrier(1, barrier(1, AlignmentMode.AT_LEAST_ONCE))
    assert r.of("snapshot") == [("snapshot", 1, False)] and h.state_name == "Tracking(1)"
    h.on_barrier(0, barrier(3, AlignmentMode.AT_LEAST_ONCE))
    h.on_cancel(1, 3)
    assert r.of("abort") == [("abort", 2), ("abort", 3)] and not h.in_progress
    h.on_barrier(1, barrier(4, AlignmentMode.AT_LEAST_ONCE))
    h.on_end_of_partition(0)  # the last live channel delivered it
    assert r.of("snapshot")[-1] == ("snapshot", 4, False)


def test_at_least_once_snapshot_of_a_newer_checkpoint_drops_older_incomplete_ones() -> None:
    r = Recorder()
    h = CheckpointBarrierTracker(2, r, r)
    h.on_barrier(0, barrier(1, AlignmentMode.AT_LEAST_ONCE))
    h.on_cancel(1, 0)  # stale: ignored
    h.on_barrier(0, barrier(2, AlignmentMode.AT_LEAST_ONCE))
    h.on_barrier(1, barrier(2, AlignmentMode.AT_LEAST_ONCE))  # channel 1 never sent barrier 1
    assert r.of("snapshot") == [("snapshot", 2, False)] and not r.of("abort") and h.last_done == 2


NOT_READY = CheckpointFailureReason.TASK_NOT_READY


def test_no_unaligned_snapshot_while_restored_in_flight_data_is_still_due() -> None:
    """A priority barrier can overtake a sender's recovered data (and its EndOfChannelState): an unaligned
    snapshot then would record newer data before that recovered data. It is declined as not ready (which
    does not count as a failed checkpoint), an aligned one goes on, and once the recovery ended an unaligned
    one is taken (issue 38)."""
    r = Recorder()
    r.restoring = True
    h = SingleCheckpointBarrierHandler.unaligned(2, r, r)
    h.on_barrier(0, barrier(1, AlignmentMode.UNALIGNED), ["x"])
    assert r.of("abort") == [("abort", 1, NOT_READY)] and not r.of("snapshot") and not h.in_progress
    h.on_barrier(1, barrier(1, AlignmentMode.UNALIGNED), [])  # the rest of it is stale
    h.on_barrier(0, barrier(2))  # aligned barriers come after EndOfChannelState: nothing is out of order
    h.on_barrier(1, barrier(2))
    assert r.of("snapshot") == [("snapshot", 2, False)]
    r.restoring = False
    h.on_barrier(1, barrier(3, AlignmentMode.UNALIGNED), ["y"])
    assert r.of("snapshot")[-1] == ("snapshot", 3, True) and len(r.of("abort")) == 1


def test_adaptive_declines_its_switch_while_restored_in_flight_data_is_still_due() -> None:
    r = Recorder()
    r.restoring = True
    now = [100.0]
    h = barrier_handler(AlignmentMode.ADAPTIVE, 2, r, r, clock=lambda: now[0])
    b = barrier(1, AlignmentMode.ADAPTIVE, ts=100.0, timeout=1.0)
    h.on_announcement(1, b)
    h.on_barrier(0, b)
    now[0] = 101.0
    h.check_timeout()
    assert r.of("abort") == [("abort", 1, NOT_READY)] and r.blocked == set() and not r.of("snapshot")
    assert h.state_name == "AlternatingWaitingForFirstBarrier"


@pytest.mark.parametrize("mode", [AlignmentMode.UNALIGNED, AlignmentMode.AT_LEAST_ONCE])
def test_a_cancel_marker_passes_its_failure_reason_on(mode: AlignmentMode) -> None:
    """Receivers decline a checkpoint its sender gave up as not ready as not ready too: whichever decline
    reaches the coordinator first, the failure does not count toward tolerable_failed_checkpoints."""
    r = Recorder()
    h = barrier_handler(mode, 2, r, r)
    h.on_barrier(0, barrier(1, AlignmentMode.AT_LEAST_ONCE if mode is AlignmentMode.AT_LEAST_ONCE else mode), [])
    h.on_cancel(1, 1, NOT_READY)
    h.on_cancel(1, 2, NOT_READY)  # not started here
    assert r.of("abort") == [("abort", 1, NOT_READY), ("abort", 2, NOT_READY)]
