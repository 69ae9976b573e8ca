"""What travels on a channel besides data batches: watermarks, barriers, cancel markers, end of partition,
the end of a restored sender's recovered in-flight data."""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = [
    "AlignmentMode",
    "CancelCheckpointMarker",
    "CheckpointAnnouncement",
    "CheckpointBarrier",
    "CheckpointKind",
    "CheckpointOptions",
    "EndOfChannelState",
    "EndOfPartition",
    "Event",
    "Watermark",
    "WatermarkStatus",
]


class CheckpointKind(enum.Enum):
    CHECKPOINT = "checkpoint"
    SAVEPOINT = "savepoint"


class AlignmentMode(enum.Enum):
    """How a task handles the barriers of one checkpoint."""

    ALIGNED = "aligned"
    AT_LEAST_ONCE = "at_least_once"
    UNALIGNED = "unaligned"
    #: aligned until ``alignment_timeout`` after the trigger, then unaligned
    ADAPTIVE = "adaptive"


@dataclass(frozen=True)
class CheckpointOptions:
    """Per-checkpoint options carried by its barriers."""

    kind: CheckpointKind = CheckpointKind.CHECKPOINT
    alignment: AlignmentMode = AlignmentMode.ALIGNED
    alignment_timeout: float | None = None
    #: the last checkpoint of a job that stops (Flink's stop-with-savepoint): sources read nothing after
    #: it, and every task finishes once it completes; if it fails, the job goes on
    terminate: bool = False
    #: with ``terminate``: sources end their input first (event time jumps to the end, timers fire)
    drain: bool = False

    @property
    def is_unaligned(self) -> bool:
        return self.alignment is AlignmentMode.UNALIGNED


@dataclass(frozen=True)
class Watermark:
    """Event time has reached ``timestamp`` (milliseconds) on this channel."""

    timestamp: int


@dataclass(frozen=True)
class WatermarkStatus:
    """The sender went idle (``idle=True``): leave its channel out of the watermark minimum until its next
    watermark."""

    idle: bool


@dataclass(frozen=True)
class CheckpointBarrier:
    """Separates the records of checkpoint ``checkpoint_id`` from those after it.

    ``timestamp`` is the coordinator's trigger time (``time.time()``), which timeout-adaptive alignment
    measures against.
    """

    checkpoint_id: int
    timestamp: float
    options: CheckpointOptions = CheckpointOptions()

    def as_unaligned(self) -> CheckpointBarrier:
        opts = CheckpointOptions(self.options.kind, AlignmentMode.UNALIGNED, self.options.alignment_timeout)
        return CheckpointBarrier(self.checkpoint_id, self.timestamp, opts)


@dataclass(frozen=True)
class CheckpointAnnouncement:
    """Priority event sent ahead of an aligned barrier (timeout-adaptive mode): the receiver learns of the
    checkpoint while its barrier is still queued behind data, so it can pull the barrier forward once
    ``aligned_checkpoint_timeout`` passed."""

    barrier: CheckpointBarrier


@dataclass(frozen=True)
class CancelCheckpointMarker:
    """Checkpoint ``checkpoint_id`` was aborted: stop aligning for it. ``failure`` names the
    ``CheckpointFailureReason`` of the task that gave it up, which receivers decline it with too (so the
    coordinator counts the checkpoint's failure the same whichever decline reaches it first)."""

    checkpoint_id: int
    failure: str = "DECLINED"


@dataclass(frozen=True)
class EndOfPartition:
    """The sender has finished: no more data on this channel."""


@dataclass(frozen=True)
class EndOfChannelState:
    """The sender, restored from a checkpoint with in-flight data, has re-sent its output channel state:
    what follows on this channel (what it makes of its input channel state, then of new input) is newer
    than every sender's output channel state (Flink's ``EndOfChannelStateEvent``). A receiver takes nothing
    more from the channel until every one of its channels delivered this (sluice.runtime.input_gate)."""


Event = (
    Watermark
    | WatermarkStatus
    | CheckpointBarrier
    | CheckpointAnnouncement
    | CancelCheckpointMarker
    | EndOfPartition
    | EndOfChannelState
)
