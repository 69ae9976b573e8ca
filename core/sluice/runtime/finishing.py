"""How a task finishes: after its input ended, once a checkpoint taken after that completed (the final
checkpoint, so sinks committed everything), or with the stop-with-savepoint checkpoint it took.

A task whose operators emit at a checkpoint even after end of input (a sink's writer stage hands its last
committables over) keeps its outputs open until the first checkpoint after end of input and sends
``EndOfPartition`` behind that checkpoint's barrier. :class:`TaskFinishing` is what the subtask's
checkpointing asks about the outputs (:class:`~sluice.checkpoint.subtask.EndOfInputOutputs`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence

from sluice.events import CheckpointBarrier, EndOfPartition
from sluice.runtime.output import RecordWriter

__all__ = ["TaskFinishing", "TaskStatus"]


class TaskStatus(enum.Enum):
    RUNNING = "running"
    #: all input ended; waiting for a checkpoint taken after that to complete (the final checkpoint)
    WAITING_FOR_FINAL = "waiting_for_final_checkpoint"
    FINISHED = "finished"


class TaskFinishing:
    """A task's status on its way to finished, and the end of its outputs.

    Args:
        writers: The task's output writers (they get ``EndOfPartition``).
        open_after_end: Keep the outputs open after end of input until the next checkpoint's barrier.
        fault: The task's fault-injection hook (point ``"final_checkpoint"``).
    """

    def __init__(
        self, writers: Sequence[RecordWriter], open_after_end: bool, fault: Callable[[str], None]
    ) -> None:
        self.status = TaskStatus.RUNNING
        #: the first checkpoint snapshotted after end of input
        self.final_after: int | None = None
        #: the stop-with-savepoint checkpoint this task took
        self.terminate_at: int | None = None
        self._writers = writers
        self._open_after_end = open_after_end
        self._fault = fault

    def input_ended(self) -> None:
        """The task's input ended (its operators were told): wait for the final checkpoint."""
        if not self._open_after_end:
            self._send_end_of_partition()
        self.status = TaskStatus.WAITING_FOR_FINAL

    def _send_end_of_partition(self) -> None:
        self._open_after_end = False
        for w in self._writers:
            w.broadcast(EndOfPartition())

    # -- EndOfInputOutputs -------------------------------------------------------------------------------
    def outputs_open(self) -> bool:
        return self.status is TaskStatus.RUNNING or self._open_after_end

    def snapshot_taken(self, barrier: CheckpointBarrier) -> None:
        if self._open_after_end and self.status is TaskStatus.WAITING_FOR_FINAL:
            self._send_end_of_partition()  # behind the barrier of the first checkpoint after end of input
        if barrier.options.terminate:
            self.terminate_at = barrier.checkpoint_id
        if self.status is TaskStatus.WAITING_FOR_FINAL and self.final_after is None:
            self.final_after = barrier.checkpoint_id

    # -- checkpoint outcomes -------------------------------------------------------------------------------
    def checkpoint_complete(self, checkpoint_id: int) -> bool:
        """``checkpoint_id`` completed; True if the task finished with it."""
        if self.status is TaskStatus.FINISHED:
            return False
        if self.terminate_at is not None and checkpoint_id >= self.terminate_at:
            self.status = TaskStatus.FINISHED  # the job stopped with this checkpoint, sinks committed it
            return True
        if self.status is TaskStatus.WAITING_FOR_FINAL and self.final_after is not None:
            if checkpoint_id >= self.final_after:
                self._fault("final_checkpoint")
                self.status = TaskStatus.FINISHED
                return True
        return False

    def checkpoint_aborted(self, checkpoint_id: int) -> None:
        if self.final_after == checkpoint_id:
            self.final_after = None
        if self.terminate_at == checkpoint_id:
            self.terminate_at = None  # the stop failed: the job goes on
