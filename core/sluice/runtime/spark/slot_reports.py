"""What a slot reports to the driver: its subtasks' reports (the slot's :class:`~sluice.runtime.task.TaskGateway`)
and its log records, each a control message (:mod:`~sluice.runtime.spark.messages`)."""

from __future__ import annotations

import logging
import pickle
import threading
import traceback
from typing import Any, Protocol

import sluice.runtime.spark.messages as m
from sluice.errors import CheckpointFailureReason, SluiceError
from sluice.graph import SubtaskId
from sluice.runtime.spark.slot_spec import SlotSpec

__all__ = ["SlotError", "SlotGateway", "SlotLogHandler", "portable"]


class SlotError(SluiceError):
    """A slot stopped abnormally (lost the driver or a peer, or one of its subtasks failed)."""


class ReportingSlot(Protocol):
    """What the reports need of their slot."""

    @property
    def spec(self) -> SlotSpec: ...
    @property
    def index(self) -> int: ...
    def send(self, msg: m.SlotMessage) -> None: ...
    def fail(self, error: BaseException, *, report: bool = False, consequence: bool = True) -> None: ...
    def task_finished(self, task: SubtaskId) -> None: ...
    def metrics_of(self, task: SubtaskId) -> dict[str, int]: ...
    def metrics_message(self, task: SubtaskId) -> m.Metrics: ...
    def subtask_of_thread(self, thread_name: str) -> str | None: ...


class SlotGateway:
    """TaskGateway of the slot's subtasks: every report becomes a control message to the driver."""

    def __init__(self, slot: ReportingSlot) -> None:
        self._slot = slot
        self._attempt = slot.spec.attempt

    def acknowledge(self, task: SubtaskId, checkpoint_id: int, handle: dict[str, Any]) -> None:
        self._slot.send(m.Acknowledge(self._attempt, task, checkpoint_id, handle))

    def decline(
        self,
        task: SubtaskId,
        checkpoint_id: int,
        reason: str,
        failure: CheckpointFailureReason = CheckpointFailureReason.DECLINED,
    ) -> None:
        self._slot.send(m.Decline(self._attempt, task, checkpoint_id, reason, failure.name))

    def end_of_input(self, task: SubtaskId) -> None:
        self._slot.send(m.EndOfInput(self._attempt, task))

    def finished(self, task: SubtaskId) -> None:
        self._slot.send(self._slot.metrics_message(task))  # the final figures, before Finished
        self._slot.send(m.Finished(self._attempt, task, self._slot.metrics_of(task)))
        self._slot.task_finished(task)

    def failed(self, task: SubtaskId, error: BaseException) -> None:
        # the report goes out before the slot stops (and so before its Goodbye): the driver sees the
        # subtask's error as the root cause, not the losses the slot's stop causes
        self._slot.send(m.TaskFailed(self._attempt, task, portable(error, self._slot.index)))
        self._slot.fail(SlotError(f"subtask {task} failed: {type(error).__name__}: {error}"))

    def request_split(self, task: SubtaskId) -> None:
        self._slot.send(m.RequestSplit(self._attempt, task))


def portable(error: BaseException, slot: int) -> BaseException:
    """A copy of ``error`` that survives pickling (else a SlotError with its type and text), with its
    traceback in the slot attached as a note (a pickled exception loses its traceback)."""
    note = f"traceback in slot {slot}:\n" + "".join(traceback.format_exception(error)).rstrip()
    try:
        copy: BaseException = pickle.loads(pickle.dumps(error))
    except Exception:
        copy = SlotError(f"{type(error).__name__}: {error}")
    copy.add_note(note)
    return copy


class SlotLogHandler(logging.Handler):
    """Ships log records to the driver, naming the subtask whose thread logged them."""

    def __init__(self, slot: ReportingSlot) -> None:
        super().__init__()
        self._slot = slot
        self._busy = threading.local()
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(self._busy, "on", False) or record.name.startswith("py4j"):
            return
        self._busy.on = True
        try:
            slot = self._slot
            subtask = slot.subtask_of_thread(record.threadName or "")
            text = self.format(record)
            slot.send(m.Log(slot.spec.attempt, slot.index, record.name, record.levelno, subtask, text))
        except Exception:
            self.handleError(record)
        finally:
            self._busy.on = False
