"""The coordinator's view of a subtask, and what becomes of a subtask's acknowledgement."""

from __future__ import annotations

from enum import Enum
from typing import Protocol

from sluice.events import CheckpointBarrier

__all__ = ["AckResult", "TaskHandle"]


class TaskHandle(Protocol):
    """The coordinator's view of a running subtask."""

    def trigger_checkpoint(self, barrier: CheckpointBarrier) -> None: ...
    def notify_checkpoint_complete(self, checkpoint_id: int) -> None: ...
    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None: ...


class AckResult(Enum):
    """What became of an acknowledgement (acknowledging never raises)."""

    SUCCESS = "success"
    #: the task already acknowledged this checkpoint
    DUPLICATE = "duplicate"
    #: a checkpoint that was never triggered
    UNKNOWN = "unknown"
    #: a checkpoint that is no longer pending (completed, aborted or subsumed)
    DISCARDED = "discarded"
