"""At-least-once barrier handling: count barriers per checkpoint, never block (Flink's ``CheckpointBarrierTracker``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sluice.checkpoint.barrier_handler import BarrierHandler, CheckpointableInput, CheckpointingTarget
from sluice.errors import CheckpointFailureReason
from sluice.events import AlignmentMode, CheckpointBarrier, CheckpointKind

__all__ = ["CheckpointBarrierTracker"]


@dataclass
class _BarrierCount:
    barrier: CheckpointBarrier
    channels: set[int]
    started_at: float

    @property
    def aligned(self) -> bool:
        # a savepoint in an at-least-once job still aligns: it must be consistent
        return self.barrier.options.kind is CheckpointKind.SAVEPOINT


class CheckpointBarrierTracker(BarrierHandler):
    """At-least-once: counts barriers per checkpoint, never blocks (savepoints excepted), and snapshots when
    every live channel delivered a checkpoint's barrier. Older checkpoints still missing barriers are
    dropped then (subsumed, as in Flink's ``CheckpointBarrierTracker``).

    Args:
        num_channels: The task's input channels.
        inputs: The input half (only a savepoint's barriers block a channel).
        checkpointing: The checkpointing half.
    """

    def __init__(
        self, num_channels: int, inputs: CheckpointableInput, checkpointing: CheckpointingTarget
    ) -> None:
        self.inputs = inputs
        self.checkpointing = checkpointing
        self.mode = AlignmentMode.AT_LEAST_ONCE
        self.live = set(range(num_channels))
        self.last_done = 0
        self._pending: dict[int, _BarrierCount] = {}

    @property
    def current(self) -> CheckpointBarrier | None:
        return self._pending[min(self._pending)].barrier if self._pending else None

    @property
    def received(self) -> set[int]:
        return self._pending[min(self._pending)].channels if self._pending else set()

    @property
    def state_name(self) -> str:
        return f"Tracking({len(self._pending)})" if self._pending else "Idle"

    def on_barrier(self, channel: int, barrier: CheckpointBarrier, overtaken: list[Any] | None = None) -> None:
        cid = barrier.checkpoint_id
        if cid <= self.last_done:
            return
        count = self._pending.get(cid)
        if count is None:
            count = self._pending[cid] = _BarrierCount(barrier, set(), time.monotonic())
        count.channels.add(channel)
        if count.aligned:
            self.inputs.block(channel)
        self._trigger_completed()

    def _trigger_completed(self) -> None:
        done = [cid for cid, count in self._pending.items() if self.live <= count.channels]
        if not done:
            return
        upto = max(done)
        for cid in sorted(c for c in self._pending if c <= upto):
            count = self._pending.pop(cid)
            if count.aligned:
                self.inputs.unblock_all()
            if self.live <= count.channels:
                self.checkpointing.perform_checkpoint(count.barrier, False)
                self.checkpointing.alignment_done(cid, time.monotonic() - count.started_at, False)
        self.last_done = max(self.last_done, upto)

    def _abort_upto(
        self, checkpoint_id: int, reason: str, failure: CheckpointFailureReason = CheckpointFailureReason.DECLINED
    ) -> None:
        """Abort every pending checkpoint up to ``checkpoint_id`` (a cancel of one subsumes older ones)."""
        for cid in sorted(c for c in self._pending if c <= checkpoint_id):
            if self._pending.pop(cid).aligned:
                self.inputs.unblock_all()
            self.checkpointing.abort_checkpoint(cid, reason, failure)
        self.last_done = max(self.last_done, checkpoint_id)

    def on_cancel(
        self, channel: int, checkpoint_id: int, failure: CheckpointFailureReason = CheckpointFailureReason.DECLINED
    ) -> None:
        if checkpoint_id <= self.last_done:
            return
        started = checkpoint_id in self._pending
        self._abort_upto(checkpoint_id, "cancelled upstream", failure)
        if not started:
            self.checkpointing.abort_checkpoint(checkpoint_id, "cancelled upstream", failure)

    def on_aborted(self, checkpoint_id: int) -> None:
        if checkpoint_id > self.last_done:
            self._abort_upto(checkpoint_id, "aborted by the coordinator")

    def on_end_of_partition(self, channel: int) -> None:
        self.live.discard(channel)
        self._trigger_completed()
