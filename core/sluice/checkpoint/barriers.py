"""Barrier handling at a task's input: which checkpoint is in progress, which channels delivered its barrier.

The handler keeps only checkpoint ids and which channels delivered their barrier; the task does the work
through :class:`BarrierTarget`. Modes are chosen by named constructors (``BarrierHandler(n, target, mode)``
builds the same):

* :meth:`BarrierHandler.aligned`, :meth:`BarrierHandler.unaligned`, :meth:`BarrierHandler.alternating`
  (timeout-adaptive): exactly-once, one checkpoint at a time (:class:`SingleCheckpointBarrierHandler`), a
  small state machine whose states (:mod:`sluice.checkpoint.barrier_states`) each handle a barrier, an
  announcement, the alignment timeout, an abort and the end of a partition, and return the next state;
* :meth:`BarrierHandler.at_least_once`: never block; snapshot when a checkpoint's last barrier arrives
  (:class:`~sluice.checkpoint.barrier_tracker.CheckpointBarrierTracker`, several checkpoints at once).

Whatever the mode, a savepoint aligns, and a priority (unaligned) barrier is never blocked behind: the data
it overtook precedes it, so the checkpoint continues unaligned (ARCHITECTURE.md section 4). Events of a
checkpoint older than the one in progress are ignored: it was skipped here because a newer one came first.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from sluice.checkpoint.barrier_states import BarrierHandlerState, waiting_state
from sluice.errors import ConfigError
from sluice.events import AlignmentMode, CheckpointBarrier

__all__ = ["BarrierHandler", "BarrierTarget", "Clock", "SingleCheckpointBarrierHandler"]

Clock = Callable[[], float]


class BarrierTarget(Protocol):
    """What the handler asks of its task."""

    def block(self, channel: int) -> None: ...
    def unblock_all(self) -> None: ...
    def perform_checkpoint(self, barrier: CheckpointBarrier, unaligned: bool) -> None:
        """Snapshot state and forward ``barrier`` (at the head of the output queues if ``unaligned``)."""

    def start_recording(self, checkpoint_id: int, channels: set[int], overtaken: dict[int, list]) -> None:  # type: ignore[type-arg]
        """Unaligned: persist overtaken input of each channel, and data of ``channels`` until their barrier."""

    def stop_recording(self, channel: int) -> None: ...
    def add_overtaken(self, checkpoint_id: int, channel: int, batches: list) -> None:  # type: ignore[type-arg]
        """Unaligned: persist input that a later channel's priority barrier overtook."""
    def finish_recording(self, checkpoint_id: int) -> None:
        """Unaligned: every channel delivered its barrier; the channel state of the checkpoint is complete."""

    def pull_barrier_forward(self, channel: int, checkpoint_id: int) -> list | None:  # type: ignore[type-arg]
        """Move a queued barrier to the head of ``channel``; returns the overtaken input, None if not queued."""

    def abort_checkpoint(self, checkpoint_id: int, reason: str) -> None: ...
    def alignment_done(self, checkpoint_id: int, alignment_s: float, switched: bool) -> None: ...


class BarrierHandler:
    """Barrier handling at one task's input channels. ``BarrierHandler(n, target, mode)`` returns the
    handler for ``mode``: a :class:`~sluice.checkpoint.barrier_tracker.CheckpointBarrierTracker` for
    at-least-once, else a :class:`SingleCheckpointBarrierHandler`.

    Attributes:
        live: channels that have not ended (only they deliver barriers).
        last_done: the highest checkpoint id completed or aborted here; events for it or older are ignored.
    """

    target: BarrierTarget
    mode: AlignmentMode
    live: set[int]
    last_done: int

    def __new__(
        cls,
        num_channels: int,
        target: BarrierTarget,
        mode: AlignmentMode = AlignmentMode.ALIGNED,
        *,
        clock: Clock = time.time,
    ) -> BarrierHandler:
        impl: type[BarrierHandler] = cls
        if cls is BarrierHandler:
            from sluice.checkpoint.barrier_tracker import CheckpointBarrierTracker

            at_least_once = mode is AlignmentMode.AT_LEAST_ONCE
            impl = CheckpointBarrierTracker if at_least_once else SingleCheckpointBarrierHandler
        return object.__new__(impl)

    @classmethod
    def aligned(cls, num_channels: int, target: BarrierTarget) -> BarrierHandler:
        """Exactly-once with aligned barriers."""
        return BarrierHandler(num_channels, target, AlignmentMode.ALIGNED)

    @classmethod
    def at_least_once(cls, num_channels: int, target: BarrierTarget) -> BarrierHandler:
        """At-least-once: never blocks a channel (savepoints still align)."""
        return BarrierHandler(num_channels, target, AlignmentMode.AT_LEAST_ONCE)

    @classmethod
    def unaligned(cls, num_channels: int, target: BarrierTarget) -> BarrierHandler:
        """Exactly-once with unaligned (priority) barriers and channel state."""
        return BarrierHandler(num_channels, target, AlignmentMode.UNALIGNED)

    @classmethod
    def alternating(cls, num_channels: int, target: BarrierTarget, *, clock: Clock = time.time) -> BarrierHandler:
        """Timeout-adaptive: aligned until the checkpoint's alignment timeout, then unaligned."""
        return BarrierHandler(num_channels, target, AlignmentMode.ADAPTIVE, clock=clock)

    # -- the interface the task uses ---------------------------------------------------------------------
    @property
    def current(self) -> CheckpointBarrier | None:
        """The barrier of the checkpoint in progress (the oldest one if several), None if none."""
        raise NotImplementedError

    @property
    def received(self) -> set[int]:
        """Channels that delivered the barrier of :attr:`current`."""
        raise NotImplementedError

    @property
    def in_progress(self) -> bool:
        return self.current is not None

    @property
    def state_name(self) -> str:
        raise NotImplementedError

    def on_barrier(self, channel: int, barrier: CheckpointBarrier, overtaken: list | None = None) -> None:  # type: ignore[type-arg]
        """Barrier ``barrier`` arrived on ``channel`` (``overtaken``: input it overtook, if priority)."""
        raise NotImplementedError

    def on_announcement(self, channel: int, barrier: CheckpointBarrier) -> None:
        """Barrier ``barrier`` is queued on ``channel`` behind data (timeout-adaptive mode)."""

    def on_cancel(self, channel: int, checkpoint_id: int) -> None:
        """A cancel marker for ``checkpoint_id`` arrived on ``channel``."""
        raise NotImplementedError

    def on_aborted(self, checkpoint_id: int) -> None:
        """The coordinator aborted ``checkpoint_id``."""
        raise NotImplementedError

    def on_end_of_partition(self, channel: int) -> None:
        """``channel`` ended: it delivers no more barriers."""
        raise NotImplementedError

    def check_timeout(self) -> None:
        """Called periodically by the task (the timeout-adaptive mode switches to unaligned here)."""


class SingleCheckpointBarrierHandler(BarrierHandler):
    """Exactly-once barrier handling, one checkpoint at a time: a newer barrier aborts the one in progress."""

    def __init__(
        self,
        num_channels: int,
        target: BarrierTarget,
        mode: AlignmentMode = AlignmentMode.ALIGNED,
        *,
        clock: Clock = time.time,
    ) -> None:
        waiting = waiting_state(mode)
        if waiting is None:
            raise ConfigError(
                f"{mode.value} barriers are counted, not aligned: use BarrierHandler(n, target, mode), "
                "which builds a CheckpointBarrierTracker"
            )
        self.target = target
        self.mode = mode
        self.clock = clock
        self.live = set(range(num_channels))
        self.last_done = 0
        self._current: CheckpointBarrier | None = None
        self._received: set[int] = set()
        self.pulled: set[int] = set()  # channels whose barrier we pulled forward (adaptive switch)
        self.switched = False
        self._started_at = 0.0
        #: the state between checkpoints, which the mode chooses
        self.waiting: BarrierHandlerState = waiting
        self._state = self.waiting

    @property
    def current(self) -> CheckpointBarrier | None:
        return self._current

    @property
    def received(self) -> set[int]:
        return self._received

    @property
    def state_name(self) -> str:
        return type(self._state).__name__

    # -- bookkeeping the states use ------------------------------------------------------------------
    def start(self, barrier: CheckpointBarrier) -> None:
        self._current = barrier
        self._received = set()
        self.pulled = set()
        self.switched = False
        self._started_at = time.monotonic()

    def continue_unaligned(self) -> CheckpointBarrier:
        """The checkpoint in progress goes on unaligned here; returns its barrier as such."""
        assert self._current is not None
        self._current = self._current.as_unaligned()
        return self._current

    def complete(self) -> None:
        assert self._current is not None
        alignment_s = time.monotonic() - self._started_at
        self.target.alignment_done(self._current.checkpoint_id, alignment_s, self.switched)
        self._end()

    def abort_current(self, reason: str) -> None:
        assert self._current is not None
        self.target.unblock_all()
        self.target.abort_checkpoint(self._current.checkpoint_id, reason)
        self._end()

    def _end(self) -> None:
        assert self._current is not None
        self.last_done = max(self.last_done, self._current.checkpoint_id)
        self._current = None
        self._received = set()
        self.pulled = set()

    def _stale(self, checkpoint_id: int) -> bool:
        # older than the one in progress: it was skipped here (a newer barrier came first)
        cur = self._current
        return checkpoint_id <= self.last_done or (cur is not None and checkpoint_id < cur.checkpoint_id)

    # -- events --------------------------------------------------------------------------------------
    def on_barrier(self, channel: int, barrier: CheckpointBarrier, overtaken: list | None = None) -> None:  # type: ignore[type-arg]
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

    def on_cancel(self, channel: int, checkpoint_id: int) -> None:
        if self._stale(checkpoint_id):
            return
        cur = self._current
        if cur is not None:
            self._state = self._state.abort(self, f"checkpoint {checkpoint_id} was cancelled upstream")
        if cur is None or cur.checkpoint_id != checkpoint_id:
            self.target.abort_checkpoint(checkpoint_id, "cancelled upstream")
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
