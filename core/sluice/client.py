"""A running job, seen from the program that started it: wait, cancel, savepoint, status.

:meth:`sluice.api.Pipeline.start` returns a :class:`JobClient`; the job runs in a background thread
(:func:`~sluice.runtime.job.run_job`) and its :class:`~sluice.runtime.status.JobStatus` changes only along
the transitions of :mod:`sluice.runtime.status`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from sluice.checkpoint.history import forget_checkpoints
from sluice.checkpoint.storage_loader import storage_for
from sluice.config.job import JobConfig
from sluice.control.monitor import JobMonitor
from sluice.errors import CheckpointError, CheckpointFailureReason
from sluice.graph import JobGraph
from sluice.runtime.fault_hook import FaultHook
from sluice.runtime.job import JobResult, run_job
from sluice.runtime.status import JobLifecycle, JobStatus

__all__ = ["JobClient"]


class JobClient:
    """A running job: wait for it, cancel it, take a savepoint, read its :class:`JobStatus`."""

    def __init__(self, job: JobGraph, cfg: JobConfig, runtime: Any, faults: FaultHook) -> None:
        self.job = job
        self.config = cfg
        self.runtime = runtime
        self._lifecycle = JobLifecycle(cfg.job_id)
        self._result: JobResult | None = None
        self._error: BaseException | None = None
        self._attempt: Any = None
        runtime_name = type(runtime).__name__.removesuffix("Runtime").lower() or "local"
        #: what the driver knows of the job across attempts (metrics, checkpoints, failures)
        self.monitor = JobMonitor(job, cfg, runtime_name, self._lifecycle)
        #: the job's control endpoint (:class:`sluice.control.server.ControlEndpoint`), if it serves one
        self.control: Any = None
        self._ended = False
        self._end_lock = threading.Lock()
        self._on_end: list[Callable[[], None]] = []
        self._thread = threading.Thread(target=self._main, args=(faults,), name=f"job-{cfg.job_id}", daemon=True)
        self._thread.start()

    def _main(self, faults: FaultHook) -> None:
        try:
            self._result = run_job(
                self.job,
                self.config,
                self.runtime.run_attempt,
                faults,
                on_attempt=self._attempt_started,
                lifecycle=self._lifecycle,
            )
        except BaseException as exc:
            self._error = exc
        finally:
            self.monitor.job_ended()
            with self._end_lock:
                self._ended = True
                callbacks, self._on_end = self._on_end, []
            for cb in callbacks:
                cb()

    def _attempt_started(self, attempt: Any) -> None:
        self._attempt = attempt
        self.monitor.attempt_started(attempt)

    def on_end(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (on the job's thread, so it must not wait for the job) once the job ended; at
        once if it has."""
        with self._end_lock:
            if not self._ended:
                self._on_end.append(callback)
                return
        callback()

    def wait(self, timeout: float | None = None) -> JobResult:
        """Wait for the job to end; raises JobFailedError if it failed for good."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"job {self.config.job_id!r} still running after {timeout}s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    @property
    def status(self) -> JobStatus:
        """Where the job is now (created, running, restarting, cancelling, ... finished)."""
        return self._lifecycle.status

    def cancel(self) -> JobResult:
        """Cancel the job and return its result (its status is ``cancelled``, or ``finished`` if it had
        finished already). Checkpoints of a cancelled job are kept if ``retain_on_cancel``."""
        if self._lifecycle.cancel():
            self.runtime.cancel()
        result = self.wait()
        cc = self.config.checkpoint
        if result.status is JobStatus.CANCELLED and not cc.retain_on_cancel:
            forget_checkpoints(storage_for(cc, self.config.job_id))
        return result

    def trigger_savepoint(self, timeout: float = 600.0) -> str:
        """Take an aligned savepoint now; returns its path (usable as ``restore=``)."""
        return self._coordinator().trigger_savepoint(timeout)  # type: ignore[no-any-return]

    def stop(self, savepoint: bool = True, drain: bool = False, timeout: float = 600.0) -> JobResult:
        """Stop the job with a last checkpoint, as Flink's stop-with-savepoint, and return its result.

        Sources stop reading; the savepoint (or, with ``savepoint=False``, a regular checkpoint) is the
        job's last checkpoint; sinks commit it; the job ends ``stopped`` and ``result.stopped_at`` is its
        path: run again with ``restore=result.stopped_at`` to go on exactly where it stopped. With
        ``drain=True`` the sources end their input first, so event time reaches its end and every
        event-time timer fires (use it when the job will not be resumed). If the savepoint fails the job
        goes on running and the error (a CheckpointError) is raised.
        """
        self._lifecycle.transition(JobStatus.STOPPING)
        try:
            self._coordinator().stop_with_savepoint(savepoint, drain, timeout)
        except BaseException:
            if self._lifecycle.status is JobStatus.STOPPING:
                self._lifecycle.advance(JobStatus.RUNNING)
            raise
        return self.wait(timeout)

    def _coordinator(self) -> Any:
        a = self._attempt
        if a is None or a.coordinator is None:
            raise CheckpointError(CheckpointFailureReason.FINISHED, "the job is not running (yet)")
        return a.coordinator

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    @property
    def checkpoint_history(self) -> list[Any]:
        """The current attempt's newest checkpoints (``CheckpointConfig.history_size``), in trigger order."""
        a = self._attempt
        return list(a.coordinator.history) if a is not None and a.coordinator is not None else []
