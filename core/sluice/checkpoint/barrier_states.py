"""The states of exactly-once barrier handling
(:class:`~sluice.checkpoint.single_barrier_handler.SingleCheckpointBarrierHandler`).

Each state handles a barrier, an announcement, the alignment timeout, an abort and the end of a partition,
and returns the next state; the handler keeps the ids and counts and is the states'
:class:`BarrierController` (cf. Flink's ``BarrierHandlerState`` and its ``Controller``)::

    aligned       WaitingForFirstBarrier ----------> CollectingBarriers ------------> (waiting)
    unaligned     WaitingForFirstBarrierUnaligned -> CollectingBarriersUnaligned ---> (waiting)
    adaptive      AlternatingWaitingForFirstBarrier -> AlternatingCollectingBarriers
                      -- timeout, or a priority barrier --> CollectingBarriersUnaligned -> (waiting)

A savepoint's barrier aligns in every mode (CollectingBarriers); a priority barrier is never blocked behind,
so whatever the state it continues the checkpoint unaligned. Except while the task is still taking in the
in-flight data of the checkpoint it restored (``inputs.recovering()``): an unaligned snapshot then would
persist that data and newer data in an order a later restore cannot undo, so the checkpoint is declined
(``TASK_NOT_READY``, which does not count as a failure), as Flink declines it.
"""

from __future__ import annotations

from typing import Any, Protocol

from sluice.checkpoint.barrier_handler import CheckpointableInput, CheckpointingTarget
from sluice.errors import CheckpointFailureReason
from sluice.events import AlignmentMode, CheckpointBarrier

__all__ = [
    "AlternatingCollectingBarriers",
    "AlternatingWaitingForFirstBarrier",
    "BarrierController",
    "BarrierHandlerState",
    "CollectingBarriers",
    "CollectingBarriersUnaligned",
    "WaitingForFirstBarrier",
    "WaitingForFirstBarrierUnaligned",
    "waiting_state",
]


class BarrierController(Protocol):
    """What a state asks of its handler: the checkpoint in progress, its bookkeeping, and the two halves
    of the task it acts on.

    Attributes:
        switched: The checkpoint in progress switched to unaligned here.
    """

    switched: bool

    @property
    def current(self) -> CheckpointBarrier | None:
        """The barrier of the checkpoint in progress."""

    @property
    def live(self) -> set[int]:
        """Channels that have not ended."""

    @property
    def received(self) -> set[int]:
        """Channels that delivered the barrier of :attr:`current`."""

    @property
    def pulled(self) -> set[int]:
        """Channels whose barrier was pulled forward (what it overtook is channel state already)."""

    @property
    def waiting(self) -> BarrierHandlerState:
        """The state between checkpoints."""

    @property
    def inputs(self) -> CheckpointableInput: ...

    @property
    def checkpointing(self) -> CheckpointingTarget: ...

    def start(self, barrier: CheckpointBarrier) -> None:
        """A checkpoint starts here with ``barrier``."""

    def alignment_timed_out(self) -> bool:
        """The checkpoint in progress was triggered longer ago than its alignment timeout."""

    def continue_unaligned(self) -> CheckpointBarrier:
        """The checkpoint in progress goes on unaligned; returns its barrier as such."""

    def complete(self) -> None:
        """Every live channel delivered the barrier: report the alignment, end the checkpoint here."""

    def abort_current(
        self, reason: str, failure: CheckpointFailureReason = CheckpointFailureReason.DECLINED
    ) -> None:
        """Unblock, abort the checkpoint in progress (declined for ``failure``), end it here."""


class BarrierHandlerState:
    """A state of exactly-once barrier handling. Each event returns the next state; ``h`` is the handler,
    whose checkpoint (``h.current``) is the event's."""

    def barrier_received(
        self, h: BarrierController, channel: int, barrier: CheckpointBarrier, overtaken: list[Any]
    ) -> BarrierHandlerState:
        """``channel`` delivered ``barrier``; a priority barrier overtook ``overtaken`` in that channel."""
        raise NotImplementedError

    def announcement_received(
        self, h: BarrierController, channel: int, barrier: CheckpointBarrier
    ) -> BarrierHandlerState:
        """``barrier`` is queued on ``channel`` behind data."""
        return self

    def alignment_timeout(self, h: BarrierController) -> BarrierHandlerState:
        """The task's periodic check: has the checkpoint aligned for too long?"""
        return self

    def abort(
        self,
        h: BarrierController,
        reason: str,
        failure: CheckpointFailureReason = CheckpointFailureReason.DECLINED,
    ) -> BarrierHandlerState:
        """Abort the checkpoint in progress (a newer barrier, a cancel marker, the coordinator)."""
        return self

    def end_of_partition(self, h: BarrierController, channel: int) -> BarrierHandlerState:
        """``channel`` ended (``h.live`` no longer holds it)."""
        return self


class WaitingForFirstBarrier(BarrierHandlerState):
    """Aligned mode, no checkpoint in progress."""

    def barrier_received(
        self, h: BarrierController, channel: int, barrier: CheckpointBarrier, overtaken: list[Any]
    ) -> BarrierHandlerState:
        h.start(barrier)
        if barrier.options.is_unaligned:
            return _snapshot_unaligned(h, channel, overtaken, switch=True)
        return CollectingBarriers().barrier_received(h, channel, barrier, overtaken)


class WaitingForFirstBarrierUnaligned(BarrierHandlerState):
    """Unaligned mode, no checkpoint in progress. A savepoint's barrier is aligned: it aligns."""

    def barrier_received(
        self, h: BarrierController, channel: int, barrier: CheckpointBarrier, overtaken: list[Any]
    ) -> BarrierHandlerState:
        h.start(barrier)
        if barrier.options.is_unaligned:
            return _snapshot_unaligned(h, channel, overtaken, switch=False)
        return CollectingBarriers().barrier_received(h, channel, barrier, overtaken)


class AlternatingWaitingForFirstBarrier(BarrierHandlerState):
    """Timeout-adaptive mode, no checkpoint in progress."""

    def barrier_received(
        self, h: BarrierController, channel: int, barrier: CheckpointBarrier, overtaken: list[Any]
    ) -> BarrierHandlerState:
        h.start(barrier)
        if barrier.options.is_unaligned:  # an upstream task already switched this checkpoint
            return _snapshot_unaligned(h, channel, overtaken, switch=True)
        if barrier.options.alignment is AlignmentMode.ADAPTIVE:
            return AlternatingCollectingBarriers().barrier_received(h, channel, barrier, overtaken)
        return CollectingBarriers().barrier_received(h, channel, barrier, overtaken)

    def announcement_received(
        self, h: BarrierController, channel: int, barrier: CheckpointBarrier
    ) -> BarrierHandlerState:
        if barrier.options.alignment is not AlignmentMode.ADAPTIVE:
            return self
        # the barrier is queued behind data on ``channel``: start the clock, block nothing yet
        h.start(barrier)
        return AlternatingCollectingBarriers()


class _Collecting(BarrierHandlerState):
    def abort(
        self,
        h: BarrierController,
        reason: str,
        failure: CheckpointFailureReason = CheckpointFailureReason.DECLINED,
    ) -> BarrierHandlerState:
        h.abort_current(reason, failure)
        return h.waiting


class CollectingBarriers(_Collecting):
    """Aligning: channels that delivered the barrier are blocked until the last one arrives."""

    def barrier_received(
        self, h: BarrierController, channel: int, barrier: CheckpointBarrier, overtaken: list[Any]
    ) -> BarrierHandlerState:
        if barrier.options.is_unaligned:
            # a priority barrier overtook data that is now behind it: blocking would leave that data out
            # of the snapshot, so this checkpoint continues unaligned here too
            return _snapshot_unaligned(h, channel, overtaken, switch=True)
        h.received.add(channel)
        h.inputs.block(channel)
        return self._maybe_complete(h)

    def end_of_partition(self, h: BarrierController, channel: int) -> BarrierHandlerState:
        return self._maybe_complete(h)

    def _maybe_complete(self, h: BarrierController) -> BarrierHandlerState:
        if not h.live <= h.received:
            return self
        assert h.current is not None
        h.inputs.unblock_all()
        h.checkpointing.perform_checkpoint(h.current, False)
        h.complete()
        return h.waiting


class AlternatingCollectingBarriers(CollectingBarriers):
    """Timeout-adaptive, aligning: once the alignment timeout passed since the trigger, continue unaligned."""

    def alignment_timeout(self, h: BarrierController) -> BarrierHandlerState:
        if not h.alignment_timed_out():
            return self
        return _snapshot_unaligned(h, None, [], switch=True)


class CollectingBarriersUnaligned(_Collecting):
    """Snapshot taken; data of the channels still missing their barrier is recorded as channel state."""

    def barrier_received(
        self, h: BarrierController, channel: int, barrier: CheckpointBarrier, overtaken: list[Any]
    ) -> BarrierHandlerState:
        h.received.add(channel)
        h.checkpointing.stop_recording(channel)
        # a priority barrier on this channel too: the input it overtook precedes it, so it is state (unless
        # we pulled that barrier forward ourselves and already persisted what it overtook)
        if overtaken and channel not in h.pulled:
            assert h.current is not None
            h.checkpointing.add_overtaken(h.current.checkpoint_id, channel, overtaken)
        return self.maybe_finish(h)

    def end_of_partition(self, h: BarrierController, channel: int) -> BarrierHandlerState:
        h.checkpointing.stop_recording(channel)
        return self.maybe_finish(h)

    def maybe_finish(self, h: BarrierController) -> BarrierHandlerState:
        if not h.live <= h.received:
            return self
        assert h.current is not None
        cid = h.current.checkpoint_id
        h.complete()
        h.checkpointing.finish_recording(cid)
        return h.waiting


def _snapshot_unaligned(
    h: BarrierController, channel: int | None, overtaken: list[Any], switch: bool
) -> BarrierHandlerState:
    """Snapshot now and record the rest as channel state. ``channel`` delivered a priority barrier that
    overtook ``overtaken`` (None: the alignment timeout fired). ``switch``: the checkpoint was aligned
    here (or an upstream task switched it): pull barriers still queued behind data forward."""
    if h.inputs.recovering():
        # a channel still owes recovered in-flight data (its priority barrier may have overtaken it): this
        # snapshot's channel state would put newer data before it
        h.abort_current("still taking in the in-flight data it restored", CheckpointFailureReason.TASK_NOT_READY)
        return h.waiting
    b = h.continue_unaligned()
    taken: dict[int, list[Any]] = {}
    if channel is not None:
        h.received.add(channel)
        taken[channel] = overtaken
    if switch:
        h.switched = True
        for c in sorted(h.live - h.received):
            got = h.inputs.pull_barrier_forward(c, b.checkpoint_id)
            if got is not None:
                taken[c] = got
                h.pulled.add(c)  # it is at the head now: what it overtook is persisted here
    h.inputs.unblock_all()
    h.checkpointing.perform_checkpoint(b, True)
    h.checkpointing.start_recording(b.checkpoint_id, h.live - h.received, taken)
    return CollectingBarriersUnaligned().maybe_finish(h)


_WAITING: dict[AlignmentMode, type[BarrierHandlerState]] = {
    AlignmentMode.ALIGNED: WaitingForFirstBarrier,
    AlignmentMode.UNALIGNED: WaitingForFirstBarrierUnaligned,
    AlignmentMode.ADAPTIVE: AlternatingWaitingForFirstBarrier,
}


def waiting_state(mode: AlignmentMode) -> BarrierHandlerState | None:
    """The state between checkpoints of ``mode`` (None: the mode is not handled one checkpoint at a time)."""
    state = _WAITING.get(mode)
    return state() if state is not None else None
