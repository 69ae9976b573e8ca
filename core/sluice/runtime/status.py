"""A job's status: :class:`JobStatus`, every transition it may take (:data:`TRANSITIONS`, the one complete
list), and :class:`JobLifecycle`, which holds one job's status and refuses any other move with
:class:`~sluice.errors.IllegalTransitionError`. The main paths::

    created ──> running ──> finished
       │          ├──> restarting ──> running      an attempt failed; the restart strategy allows another
       │          ├──> stopping ──> stopped        stop with a savepoint
       │          │       └──> running             the savepoint failed: the job goes on (as in Flink)
       ├──────────┴──> failing ──> failed          no restart left, or a restart cannot help
       └──> cancelling ──> cancelled               asked for while created, running, restarting or stopping

The job's own thread moves it on (:meth:`JobLifecycle.advance`); a client may ask to cancel at any moment
(:meth:`JobLifecycle.cancel`), and a cancel wins over whatever the job's thread does next.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType

from sluice.errors import IllegalTransitionError

__all__ = ["TRANSITIONS", "JobLifecycle", "JobStatus", "check_transition"]


class JobStatus(enum.StrEnum):
    """Where a job is in its life (a string: ``result.status == "finished"`` holds)."""

    CREATED = "created"
    RUNNING = "running"
    RESTARTING = "restarting"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"
    FAILING = "failing"
    FAILED = "failed"
    FINISHED = "finished"
    STOPPING = "stopping"
    STOPPED = "stopped"

    @property
    def is_terminal(self) -> bool:
        """The job has ended: no transition leaves this status."""
        return not TRANSITIONS[self]


_S = JobStatus

#: every legal transition; any other is refused
TRANSITIONS: Mapping[JobStatus, frozenset[JobStatus]] = MappingProxyType(
    {
        _S.CREATED: frozenset({_S.RUNNING, _S.CANCELLING, _S.FAILING}),
        _S.RUNNING: frozenset({_S.FINISHED, _S.RESTARTING, _S.FAILING, _S.CANCELLING, _S.STOPPING}),
        _S.RESTARTING: frozenset({_S.RUNNING, _S.FAILING, _S.CANCELLING}),
        # as in Flink, a stop-with-savepoint whose savepoint fails leaves the job running
        _S.STOPPING: frozenset({_S.STOPPED, _S.RUNNING, _S.RESTARTING, _S.FAILING, _S.CANCELLING}),
        _S.CANCELLING: frozenset({_S.CANCELLED}),
        _S.FAILING: frozenset({_S.FAILED}),
        _S.FINISHED: frozenset(),
        _S.CANCELLED: frozenset(),
        _S.FAILED: frozenset(),
        _S.STOPPED: frozenset(),
    }
)


def check_transition(current: JobStatus, target: JobStatus, job_id: str = "") -> None:
    """Raise :class:`~sluice.errors.IllegalTransitionError` unless ``current -> target`` is in the table."""
    allowed = TRANSITIONS[current]
    if target not in allowed:
        job = f"job {job_id!r}: " if job_id else ""
        options = ", ".join(sorted(allowed)) or "nothing, it has ended"
        raise IllegalTransitionError(
            f"{job}cannot go from {current} to {target} (from {current} it may go to: {options}); "
            "this is a bug in sluice, please report it with the job's log"
        )


class JobLifecycle:
    """The status of one job, changed only along :data:`TRANSITIONS` (thread-safe).

    Attributes:
        job_id: the job this is the status of.
        history: every status the job took, with the time (``time.time()``) it took it.
    """

    def __init__(self, job_id: str, status: JobStatus = JobStatus.CREATED) -> None:
        self.job_id = job_id
        self._status = status
        self._cond = threading.Condition()
        self._cancel_hook: Callable[[], None] | None = None
        self.history: list[tuple[JobStatus, float]] = [(status, time.time())]

    @property
    def status(self) -> JobStatus:
        return self._status

    def transition(self, target: JobStatus) -> None:
        """Move to ``target``; raises IllegalTransitionError if the table does not allow it."""
        with self._cond:
            self._move(target)

    def advance(self, target: JobStatus) -> bool:
        """The job's thread moves on to ``target``; returns False (and stays) if a cancel came first."""
        with self._cond:
            if self._status is JobStatus.CANCELLING and target is not JobStatus.CANCELLED:
                return False
            self._move(target)
            return True

    def cancel(self) -> bool:
        """Ask the job to cancel: True if it is cancelling now, False if it already was or has ended."""
        with self._cond:
            if JobStatus.CANCELLING not in TRANSITIONS[self._status]:
                return False
            self._move(JobStatus.CANCELLING)
            hook = self._cancel_hook
        if hook is not None:
            hook()
        return True

    def on_cancel(self, hook: Callable[[], None] | None) -> None:
        """Call ``hook`` when a cancel is asked for (at once if it already was); it replaces the last one."""
        with self._cond:
            self._cancel_hook = hook
            cancelling = self._status is JobStatus.CANCELLING
        if cancelling and hook is not None:
            hook()

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (a restart delay), or less if a cancel is asked for meanwhile."""
        with self._cond:
            self._cond.wait_for(lambda: self._status is JobStatus.CANCELLING, timeout=seconds)

    def _move(self, target: JobStatus) -> None:
        check_transition(self._status, target, self.job_id)
        self._status = target
        self.history.append((target, time.time()))
        self._cond.notify_all()
