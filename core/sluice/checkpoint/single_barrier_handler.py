"""Exactly-once barrier handling, one checkpoint at a time (Flink's ``SingleCheckpointBarrierHandler``).

A small state machine: the states (:mod:`sluice.checkpoint.barrier_states`) each handle a barrier, an
announcement, the alignment timeout, an abort and the end of a partition, and return the next state; the
handler keeps the ids and counts, and is the states' :class:`~sluice.checkpoint.barrier_states.BarrierController`.
Modes are chosen by named constructors: :meth:`SingleCheckpointBarrierHandler.aligned`,
:meth:`~SingleCheckpointBarrierHandler.unaligned`, :meth:`~SingleCheckpointBarrierHandler.alternating`
(timeout-adaptive). A newer barrier aborts the checkpoint in progress.
"""

from __future__ import annotations

import time
from typing import Any

from sluice.checkpoint.barrier_handler import BarrierHandler, CheckpointableInput, CheckpointingTarget, Clock
from sluice.checkpoint.barrier_states import BarrierHandlerState, waiting_state
from sluice.errors import CheckpointFailureReason, ConfigError
from sluice.events import AlignmentMode, CheckpointBarrier

__all__ = ["SingleCheckpointBarrierHandler"]


class SingleCheckpointBarrierHandler(BarrierHandler):
    """Exactly-once barrier handling, one checkpoint at a time: a newer barrier aborts the one in progress.

    Args:
        num_channels: The task's input channels.
        inputs: The input half (block, unblock, pull a barrier forward).
        checkpointing: The checkpointing half (snapshot, channel state, abort, alignment done).
        mode: Aligned, unaligned or timeout-adaptive.
        clock: Wall-clock seconds (the adaptive mode compares it with the barrier's trigger time).
    """

    def __init__(
        self,
        num_channels: int,
        inputs: CheckpointableInput,
        checkpointing: CheckpointingTarget,
        mode: AlignmentMode = AlignmentMode.ALIGNED,
        *,
        clock: Clock = time.time,
    ) -> None:
        waiting = waiting_state(mode)
        if waiting is None:
            raise ConfigError(
                f"{mode.value} barriers are counted, not aligned: use barrier_handler(mode, ...), "
                "which builds a CheckpointBarrierTracker"
            )
        self.inputs = inputs
        self.checkpointing = checkpointing
        self.mode = mode
        self.clock = clock
        self.live = set(range(num_channels))
        self.last_done = 0
        self._current: CheckpointBarrier | None = None
        self._received: set[int] = set()
        self._pulled: set[int] = set()  # channels whose barrier we pulled forward (adaptive switch)
        self.switched = False
        self._started_at = 0.0
        self._waiting = waiting
        self._state = waiting

    @classmethod
    def aligned(
        cls, num_channels: int, inputs: CheckpointableInput, checkpointing: CheckpointingTarget
    ) -> SingleCheckpointBarrierHandler:
        """Exactly-once with aligned barriers."""
        return cls(num_channels, inputs, checkpointing, AlignmentMode.ALIGNED)

    @classmethod
    def unaligned(
        cls, num_channels: int, inputs: CheckpointableInput, checkpointing: CheckpointingTarget
    ) -> SingleCheckpointBarrierHandler:
        """Exactly-once with unaligned (priority) barriers and channel state."""
        return cls(num_channels, inputs, checkpointing, AlignmentMode.UNALIGNED)

    @classmethod
    def alternating(
        cls,
        num_channels: int,
        inputs: CheckpointableInput,
        checkpointing: CheckpointingTarget,
        *,
        clock: Clock = time.time,
    ) -> SingleCheckpointBarrierHandler:
        """Timeout-adaptive: aligned until the checkpoint's alignment timeout, then unaligned."""
        return cls(num_channels, inputs, checkpointing, AlignmentMode.ADAPTIVE, clock=clock)

    @property
    def current(self) -> CheckpointBarrier | None:
        return self._current

    @property
    def received(self) -> set[int]:
        return self._received

    @property
    def pulled(self) -> set[int]:
        return self._pulled

    @property
    def waiting(self) -> BarrierHandlerState:
        """The state between checkpoints, which the mode chooses."""
        return self._waiting

    @property
    def state_name(self) -> str:
        return type(self._state).__name__

    # -- the BarrierController the states use --------------------------------------------------------
    def start(self, barrier: CheckpointBarrier) -> None:
        self._current = barrier
        self._received = set()
        self._pulled = set()
        self.switched = False
        self._started_at = time.monotonic()

    def alignment_timed_out(self) -> bool:
        b = self._current
        assert b is not None
        return self.clock() - b.timestamp >= (b.options.alignment_timeout or 0.0)

    def continue_unaligned(self) -> CheckpointBarrier:
        """The checkpoint in progress goes on unaligned here; returns its barrier as such."""
        assert self._current is not None
        self._current = self._current.as_unaligned()
        return self._current

    def complete(self) -> None:
        assert self._current is not None
        alignment_s = time.monotonic() - self._started_at
        self.checkpointing.alignment_done(self._current.checkpoint_id, alignment_s, self.switched)
        self._end()

    def abort_current(
        self, reason: str, failure: CheckpointFailureReason = CheckpointFailureReason.DECLINED
    ) -> None:
        assert self._current is not None
        self.inputs.unblock_all()
        self.checkpointing.abort_checkpoint(self._current.checkpoint_id, reason, failure)
        self._end()

    def _end(self) -> None:
        assert self._current is not None
        self.last_done = max(self.last_done, self._current.checkpoint_id)
        self._current = None
        self._received = set()
        self._pulled = set()

    def _stale(self, checkpoint_id: int) -> bool:
        # older than the one in progress: it was skipped here (a newer barrier came first)
        cur = self._current
        return checkpoint_id <= self.last_done or (cur is not None and checkpoint_id < cur.checkpoint_id)

    # -- events --------------------------------------------------------------------------------------
    def on_barrier(self, channel: int, barrier: CheckpointBarrier, overtaken: list[Any] | None = None) -> None:
        cid = barrier.checkpoint_id
        if self._stale(cid):
            return
        cur = self._current
        if cur is not None and cid > cur.checkpoint_id:
            reason = f"barrier of checkpoint {cid} arrived before checkpoint {cur.checkpoint_id} completed here"
            self._state = self._state.abort(self, reason)
        self._state = self._state.barrier_received(self, channel, barrier, overtaken or [])

    def on_announcement(self, channel: int, barrier: CheckpointBarrier) -> None:
        # while a checkpoint is in progress, a later one's barrier is queued behind this one's: ignore it
        if self._current is None and not self._stale(barrier.checkpoint_id):
            self._state = self._state.announcement_received(self, channel, barrier)

    def on_cancel(
        self, channel: int, checkpoint_id: int, failure: CheckpointFailureReason = CheckpointFailureReason.DECLINED
    ) -> None:
        if self._stale(checkpoint_id):
            return
        cur = self._current
        if cur is not None:
            # the one in progress is given up for the reason of the cancelled one if it is that one
            why = failure if cur.checkpoint_id == checkpoint_id else CheckpointFailureReason.DECLINED
            self._state = self._state.abort(self, f"checkpoint {checkpoint_id} was cancelled upstream", why)
        if cur is None or cur.checkpoint_id != checkpoint_id:
            self.checkpointing.abort_checkpoint(checkpoint_id, "cancelled upstream", failure)
        self.last_done = max(self.last_done, checkpoint_id)

    def on_aborted(self, checkpoint_id: int) -> None:
        cur = self._current
        if cur is not None and cur.checkpoint_id <= checkpoint_id:
            self._state = self._state.abort(self, "aborted by the coordinator")
        self.last_done = max(self.last_done, checkpoint_id)

    def on_end_of_partition(self, channel: int) -> None:
        self.live.discard(channel)
        self._state = self._state.end_of_partition(self, channel)

    def check_timeout(self) -> None:
        self._state = self._state.alignment_timeout(self)
