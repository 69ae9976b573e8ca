"""Barrier handling at a task's input, as a small state machine (one class per state).

The handler keeps only checkpoint ids and which channels delivered their barrier; the task does the work
through :class:`BarrierTarget`. Modes are chosen by named constructors:

* :meth:`BarrierHandler.aligned` - block a channel at its barrier until every live channel delivered it;
* :meth:`BarrierHandler.at_least_once` - never block; snapshot when the last barrier arrives;
* :meth:`BarrierHandler.unaligned` / :meth:`BarrierHandler.alternating` - see ARCHITECTURE.md section 4:
  snapshot at the first barrier and record in-flight data as channel state (alternating starts aligned and
  switches once ``aligned_checkpoint_timeout`` passed since the trigger).
"""

from __future__ import annotations

import time
from typing import Protocol

from sluice.events import AlignmentMode, CheckpointBarrier, CheckpointKind

__all__ = ["BarrierHandler", "BarrierTarget"]


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


class _State:
    """A handler state. Each event returns the next state."""

    def barrier(self, h: BarrierHandler, ch: int, b: CheckpointBarrier) -> _State:
        raise NotImplementedError

    def announcement(self, h: BarrierHandler, ch: int, b: CheckpointBarrier) -> _State:
        return self

    def timeout(self, h: BarrierHandler) -> _State:
        return self


class _WaitingForFirstBarrier(_State):
    def barrier(self, h: BarrierHandler, ch: int, b: CheckpointBarrier) -> _State:
        h.begin(b)
        unaligned = b.options.is_unaligned or h.cur_mode is AlignmentMode.UNALIGNED
        if unaligned:
            return _CollectingUnaligned.start(h, ch, b)
        h.received.add(ch)
        if h.cur_mode is AlignmentMode.ALIGNED or h.cur_mode is AlignmentMode.ADAPTIVE:
            h.target.block(ch)
        return h.maybe_done(_CollectingAligned())

    def announcement(self, h: BarrierHandler, ch: int, b: CheckpointBarrier) -> _State:
        # the barrier is queued behind data on ``ch``: start the clock without blocking anything
        h.begin(b)
        return _CollectingAligned()


class _CollectingAligned(_State):
    def barrier(self, h: BarrierHandler, ch: int, b: CheckpointBarrier) -> _State:
        if b.options.is_unaligned:
            # a priority barrier overtook data that is now behind it: blocking would lose that data,
            # so this checkpoint continues unaligned here too
            return self._switch(h, ch)
        h.received.add(ch)
        if h.cur_mode is not AlignmentMode.AT_LEAST_ONCE:
            h.target.block(ch)
        return h.maybe_done(self)

    def timeout(self, h: BarrierHandler) -> _State:
        if h.cur_mode is not AlignmentMode.ADAPTIVE or h.current is None:
            return self
        if time.time() - h.current.timestamp < (h.current.options.alignment_timeout or 0):
            return self
        return self._switch(h, None)

    def _switch(self, h: BarrierHandler, ch: int | None) -> _State:
        assert h.current is not None
        h.switched = True
        b = h.current.as_unaligned()
        h.current = b
        overtaken: dict[int, list] = {}  # type: ignore[type-arg]
        if ch is not None:
            h.received.add(ch)
            if ch in h.pending_overtaken:
                overtaken[ch] = h.pending_overtaken.pop(ch)
        # channels still missing their barrier: pull it forward where it is already queued
        for c in sorted(h.live - h.received):
            got = h.target.pull_barrier_forward(c, b.checkpoint_id)
            if got is not None:
                overtaken[c] = got
                h.pulled.add(c)
        h.target.unblock_all()
        h.target.perform_checkpoint(b, True)
        pending = h.live - h.received - set(overtaken)
        # channels whose barrier we pulled forward deliver it next; record their overtaken input now
        h.target.start_recording(b.checkpoint_id, pending | (set(overtaken) - h.received), overtaken)
        state = _CollectingUnaligned()
        return state.maybe_finish(h)


class _CollectingUnaligned(_State):
    @staticmethod
    def start(h: BarrierHandler, ch: int, b: CheckpointBarrier) -> _State:
        h.current = b if b.options.is_unaligned else b.as_unaligned()
        h.received.add(ch)
        h.target.perform_checkpoint(h.current, True)
        overtaken = {ch: h.pending_overtaken.pop(ch, [])}
        h.target.start_recording(b.checkpoint_id, h.live - h.received, overtaken)
        return _CollectingUnaligned().maybe_finish(h)

    def barrier(self, h: BarrierHandler, ch: int, b: CheckpointBarrier) -> _State:
        h.received.add(ch)
        h.target.stop_recording(ch)
        # a priority barrier on this channel too: the input it overtook precedes it, so it is state (unless
        # we pulled that barrier forward ourselves and already persisted what it overtook)
        overtaken = h.pending_overtaken.pop(ch, None)
        if overtaken and ch not in h.pulled:
            h.target.add_overtaken(b.checkpoint_id, ch, overtaken)
        return self.maybe_finish(h)

    def maybe_finish(self, h: BarrierHandler) -> _State:
        if h.live <= h.received:
            assert h.current is not None
            h.target.finish_recording(h.current.checkpoint_id)
            h.finish(unaligned=True)
            return _WaitingForFirstBarrier()
        return self


class BarrierHandler:
    """Tracks barriers of the current checkpoint across a task's input channels."""

    def __init__(self, num_channels: int, target: BarrierTarget, mode: AlignmentMode) -> None:
        self.target = target
        self.mode = mode
        self.live: set[int] = set(range(num_channels))
        self.received: set[int] = set()
        self.pulled: set[int] = set()  # channels whose barrier we pulled forward (adaptive switch)
        self.cur_mode = mode
        self.current: CheckpointBarrier | None = None
        self.last_done = 0
        self.switched = False
        self.started_at = 0.0
        self.pending_overtaken: dict[int, list] = {}  # type: ignore[type-arg]
        self._state: _State = _WaitingForFirstBarrier()

    @classmethod
    def aligned(cls, num_channels: int, target: BarrierTarget) -> BarrierHandler:
        return cls(num_channels, target, AlignmentMode.ALIGNED)

    @classmethod
    def at_least_once(cls, num_channels: int, target: BarrierTarget) -> BarrierHandler:
        return cls(num_channels, target, AlignmentMode.AT_LEAST_ONCE)

    @classmethod
    def unaligned(cls, num_channels: int, target: BarrierTarget) -> BarrierHandler:
        return cls(num_channels, target, AlignmentMode.UNALIGNED)

    @classmethod
    def alternating(cls, num_channels: int, target: BarrierTarget) -> BarrierHandler:
        return cls(num_channels, target, AlignmentMode.ADAPTIVE)

    # -- bookkeeping used by states ------------------------------------------------------------------
    @property
    def in_progress(self) -> bool:
        return self.current is not None

    def begin(self, b: CheckpointBarrier) -> None:
        # the mode is chosen per checkpoint: savepoints are always aligned
        self.cur_mode = AlignmentMode.ALIGNED if b.options.kind is CheckpointKind.SAVEPOINT else self.mode
        self.current = b
        self.received = set()
        self.pulled = set()
        self.switched = False
        self.started_at = time.monotonic()

    def maybe_done(self, state: _State) -> _State:
        if self.live <= self.received:
            assert self.current is not None
            self.target.unblock_all()
            self.target.perform_checkpoint(self.current, False)
            self.finish(unaligned=False)
            return _WaitingForFirstBarrier()
        return state

    def finish(self, unaligned: bool) -> None:
        assert self.current is not None
        self.target.alignment_done(
            self.current.checkpoint_id, time.monotonic() - self.started_at, self.switched
        )
        self.last_done = self.current.checkpoint_id
        self.current = None
        self.received = set()

    def _abort_current(self, reason: str) -> None:
        if self.current is not None:
            cid = self.current.checkpoint_id
            self.target.unblock_all()
            self.target.abort_checkpoint(cid, reason)
            self.last_done = cid
            self.current = None
            self.received = set()
            self._state = _WaitingForFirstBarrier()

    # -- events --------------------------------------------------------------------------------------
    def on_barrier(self, channel: int, barrier: CheckpointBarrier, overtaken: list | None = None) -> None:  # type: ignore[type-arg]
        """Barrier ``barrier`` arrived on ``channel`` (``overtaken``: input it overtook, if priority)."""
        cid = barrier.checkpoint_id
        if cid <= self.last_done:
            return  # late barrier of a checkpoint already done or aborted
        if self.current is not None and cid > self.current.checkpoint_id:
            if isinstance(self._state, _CollectingUnaligned):
                self._abort_current(f"checkpoint {cid} started before channel state of this one was complete")
            else:
                self._abort_current(f"barrier {cid} arrived before alignment of this checkpoint finished")
        if overtaken:
            self.pending_overtaken[channel] = overtaken
        self._state = self._state.barrier(self, channel, barrier)
        self.pending_overtaken.pop(channel, None)

    def on_announcement(self, channel: int, barrier: CheckpointBarrier) -> None:
        """Barrier ``barrier`` is queued on ``channel`` behind data (timeout-adaptive mode)."""
        if barrier.checkpoint_id <= self.last_done:
            return
        if self.current is None:
            self._state = self._state.announcement(self, channel, barrier)

    def on_cancel(self, channel: int, checkpoint_id: int) -> None:
        """A cancel marker for ``checkpoint_id`` arrived."""
        if checkpoint_id <= self.last_done:
            return
        if self.current is not None and self.current.checkpoint_id == checkpoint_id:
            self._abort_current("cancelled upstream")
        else:
            if self.current is not None and checkpoint_id > self.current.checkpoint_id:
                self._abort_current("a later checkpoint was cancelled upstream")
            self.target.abort_checkpoint(checkpoint_id, "cancelled upstream")
            self.last_done = checkpoint_id

    def on_aborted(self, checkpoint_id: int) -> None:
        """The coordinator aborted ``checkpoint_id``."""
        if self.current is not None and self.current.checkpoint_id <= checkpoint_id:
            self._abort_current("aborted by the coordinator")
        self.last_done = max(self.last_done, checkpoint_id)

    def on_end_of_partition(self, channel: int) -> None:
        """``channel`` ended: it delivers no more barriers."""
        self.live.discard(channel)
        if self.current is not None:
            if isinstance(self._state, _CollectingUnaligned):
                self.target.stop_recording(channel)
                self._state = self._state.maybe_finish(self)
            else:
                self._state = self.maybe_done(self._state)

    def check_timeout(self) -> None:
        """Called periodically by the task (adaptive mode switches to unaligned here)."""
        if self.current is not None:
            self._state = self._state.timeout(self)

    @property
    def state_name(self) -> str:
        return type(self._state).__name__.lstrip("_")
