"""Barrier handling at a task's input: what a handler is, and the two halves of the task it acts on.

A handler keeps only checkpoint ids and which channels delivered their barrier. It acts on two halves:

* the input (:class:`CheckpointableInput`, the task's input gate): block a channel, unblock all, pull a
  queued barrier forward;
* the subtask's checkpointing (:class:`CheckpointingTarget`): perform the snapshot, record channel state,
  abort, report the alignment.

:func:`sluice.checkpoint.barriers.barrier_handler` builds the handler of a mode.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from sluice.errors import CheckpointFailureReason
from sluice.events import AlignmentMode, CheckpointBarrier

__all__ = ["BarrierHandler", "CheckpointableInput", "CheckpointingTarget", "Clock"]

Clock = Callable[[], float]


class CheckpointableInput(Protocol):
    """The input half: what a handler asks of the task's input channels (Flink ``CheckpointableInput``)."""

    def block(self, channel: int) -> None:
        """Take no more input from ``channel`` until :meth:`unblock_all` (aligned checkpoints)."""

    def unblock_all(self) -> None:
        """Alignment is over: every channel delivers input again."""

    def pull_barrier_forward(self, channel: int, checkpoint_id: int) -> list[Any] | None:
        """Move a queued barrier to the head of ``channel``; returns the overtaken input, None if not queued."""

    def recovering(self) -> bool:
        """After a restore with in-flight data: some channel has not yet delivered the end of its sender's
        recovered data, so an unaligned snapshot now would persist recovered and later data out of order."""


class CheckpointingTarget(Protocol):
    """The checkpointing half: what a handler asks of the subtask's checkpointing."""

    def perform_checkpoint(self, barrier: CheckpointBarrier, unaligned: bool) -> None:
        """Snapshot state and forward ``barrier`` (at the head of the output queues if ``unaligned``)."""

    def start_recording(self, checkpoint_id: int, channels: set[int], overtaken: dict[int, list[Any]]) -> None:
        """Unaligned: persist overtaken input of each channel, and data of ``channels`` until their barrier."""

    def stop_recording(self, channel: int) -> None:
        """Unaligned: ``channel`` delivered its barrier (or ended): what follows is not channel state."""

    def add_overtaken(self, checkpoint_id: int, channel: int, batches: list[Any]) -> None:
        """Unaligned: persist input that a later channel's priority barrier overtook."""

    def finish_recording(self, checkpoint_id: int) -> None:
        """Unaligned: every channel delivered its barrier; the channel state of the checkpoint is complete."""

    def abort_checkpoint(
        self, checkpoint_id: int, reason: str, failure: CheckpointFailureReason = CheckpointFailureReason.DECLINED
    ) -> None:
        """Give up ``checkpoint_id`` here (cancel it downstream, decline it for ``failure``)."""

    def alignment_done(self, checkpoint_id: int, alignment_s: float, switched: bool) -> None:
        """The checkpoint aligned in ``alignment_s`` seconds (``switched``: to unaligned on the way)."""


class BarrierHandler:
    """Barrier handling at one task's input channels: the interface the input gate and the task use.

    Attributes:
        inputs: The input half it blocks, unblocks and pulls barriers forward on.
        checkpointing: The checkpointing half it has snapshots taken by.
        mode: The alignment mode it was built for.
        live: Channels that have not ended (only they deliver barriers).
        last_done: The highest checkpoint id completed or aborted here; events for it or older are ignored.
    """

    inputs: CheckpointableInput
    checkpointing: CheckpointingTarget
    mode: AlignmentMode
    live: set[int]
    last_done: int

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

    def on_barrier(self, channel: int, barrier: CheckpointBarrier, overtaken: list[Any] | None = None) -> None:
        """Barrier ``barrier`` arrived on ``channel`` (``overtaken``: input it overtook, if priority)."""
        raise NotImplementedError

    def on_announcement(self, channel: int, barrier: CheckpointBarrier) -> None:
        """Barrier ``barrier`` is queued on ``channel`` behind data (timeout-adaptive mode)."""

    def on_cancel(
        self, channel: int, checkpoint_id: int, failure: CheckpointFailureReason = CheckpointFailureReason.DECLINED
    ) -> None:
        """A cancel marker for ``checkpoint_id`` arrived on ``channel`` (``failure``: why it was given up)."""
        raise NotImplementedError

    def on_aborted(self, checkpoint_id: int) -> None:
        """The coordinator aborted ``checkpoint_id``."""
        raise NotImplementedError

    def on_end_of_partition(self, channel: int) -> None:
        """``channel`` ended: it delivers no more barriers."""
        raise NotImplementedError

    def check_timeout(self) -> None:
        """Called periodically by the task (the timeout-adaptive mode switches to unaligned here)."""
