"""Running a job: the restart strategy around attempts, and which checkpoint each attempt restores.

``run_job`` applies the restart strategy (tenacity) around attempts and moves the job's
:class:`~sluice.runtime.status.JobStatus` along its table (created, running, restarting, ... finished). An attempt loads the checkpoint to
restore (the user's, or the latest completed one after a failure), lets sinks clean up what later,
unfinished checkpoints left behind, re-commits the restored committables, starts the coordinator and the
source enumerators (:class:`~sluice.runtime.attempt.JobAttempt`). The runtime (in-process or Spark) only
supplies channels, threads or processes (:mod:`sluice.runtime.assembly` builds the tasks).

Restore "latest" takes the newest completed checkpoint only if it is the newest the job's records
(:mod:`sluice.checkpoint.history`) say completed; else it refuses, naming it. After a failure an attempt
restores the newest checkpoint this run completed (never an older one), else what the first attempt did.
"""

from __future__ import annotations

import logging
import posixpath
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sluice.checkpoint.history import expected_latest, highest_id, latest_checkpoint, refused
from sluice.checkpoint.stats import CheckpointCounts, CheckpointStats
from sluice.checkpoint.storage import CheckpointStorage
from sluice.checkpoint.storage_loader import storage_for
from sluice.config.job import JobConfig
from sluice.errors import ConfigError, GraphError, JobFailedError, RestoreError, SluiceError, is_recoverable
from sluice.graph import JobGraph
from sluice.runtime.attempt import AttemptFailedError, JobAttempt
from sluice.runtime.fault_hook import NO_FAULTS, FaultHook
from sluice.runtime.restore import RestoredCheckpoint
from sluice.runtime.status import JobLifecycle, JobStatus
from sluice.runtime.task_metrics import merge_attempt, vertex_totals

__all__ = ["JobConfig", "JobResult", "check_at_start", "run_job"]

log = logging.getLogger("sluice.job")


@dataclass
class JobResult:
    """What a finished (or cancelled) job reports.

    Attributes:
        status: ``JobStatus.FINISHED`` or ``JobStatus.CANCELLED`` (a string enum: ``== "finished"`` holds).
        attempts: attempts run (restarts + 1).
        last_checkpoint: id of the last completed checkpoint, if any.
        checkpoints: statistics of the job's newest checkpoints (``CheckpointConfig.history_size``) over
            its attempts, oldest first.
        metrics: task and global-committer metrics summed over subtasks and attempts.
        failures: one line per failed attempt.
        stopped_at: the path of the job's last checkpoint or savepoint if it was stopped (``stopped``).
        vertex_metrics: per vertex (by name), its subtasks' built-in metrics summed over attempts: records,
            bytes and batches in and out, busy / idle / backpressured seconds, side-output rows (dead
            letters), counters and gauges (see :mod:`sluice.runtime.task_metrics`); empty if the job ran
            without metrics.
        checkpoint_counts: totals over every checkpoint of every attempt (completed, failed, ...).
        reported: True when ``sluice run`` ran the job (the job file's ``pipeline.run()`` under it) and has
            printed :meth:`summary` and, for a stopped job, how to resume: a job file that prints its own
            result line skips it then, so the line shows once under ``python job.py`` and ``sluice run``.
    """

    job_id: str
    status: JobStatus
    attempts: int
    last_checkpoint: int | None
    checkpoints: list[CheckpointStats]
    metrics: dict[str, int]
    failures: list[str]
    stopped_at: str | None = None
    vertex_metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    checkpoint_counts: CheckpointCounts = field(default_factory=CheckpointCounts)
    reported: bool = False

    def summary(self) -> str:
        """One line: ``job <id>: <status> after <n> attempt(s)`` and where it ended (the savepoint or
        checkpoint of a stopped job, else its last checkpoint)."""
        if self.stopped_at:
            ended = f" at {posixpath.basename(self.stopped_at.rstrip('/'))}"
        else:
            ended = f"; last checkpoint {self.last_checkpoint}"
        return f"job {self.job_id}: {self.status} after {self.attempts} attempt(s){ended}"


@dataclass
class RunRestore:
    """What a run has restored and completed, so that a restart never goes back behind it."""

    #: checkpoints with an id below this belong to earlier runs of the job
    floor: int = 0
    #: the checkpoint (or savepoint) the first attempt restored
    first: str | None = None
    #: the newest checkpoint this run completed (or restored), by id
    latest: int | None = None


def check_at_start(cfg: JobConfig) -> None:
    """What is checked before the job starts: its checkpoint storage can be written (a file is written
    and deleted), and the checkpoint to restore has readable metadata (for ``latest``: the newest one
    the job completed).

    Raises:
        StorageError: the storage cannot be written (not recoverable; names the location).
        RestoreError: the checkpoint to restore is missing or its metadata unreadable (names it).
    """
    storage = storage_for(cfg.checkpoint, cfg.job_id)
    storage.check_writable()
    if cfg.restore == "latest":
        _latest(storage, expected_latest(storage))
    elif cfg.restore != "none":
        storage.read_metadata_at(cfg.restore)


def resolve_restore(
    cfg: JobConfig, storage: CheckpointStorage, attempt: int, run: RunRestore | None = None
) -> RestoredCheckpoint | None:
    """Which checkpoint an attempt restores: at the start what the user asked for (``latest`` resumes a
    previous run of the same job id, refusing if its newest completed checkpoint is missing or unreadable);
    after a failure the newest checkpoint this run completed, else what the first attempt restored."""
    run = run or RunRestore()
    if attempt == 0:
        run.floor = highest_id(storage) + 1
        if cfg.restore == "none":
            return None
        if cfg.restore != "latest":
            return _load(cfg, storage, cfg.restore)
        path, older = _latest(storage, expected_latest(storage))
    else:
        expected = run.latest if run.latest is not None and run.latest >= run.floor else None
        path, older = _latest(storage, expected, floor=run.floor)
        if path is None:
            return _load(cfg, storage, run.first) if run.first is not None else None
    if path is None:
        return None
    try:
        return _load(cfg, storage, path)
    except RestoreError as exc:
        raise refused(f"the job's newest completed checkpoint {path} cannot be restored: {exc}", older) from None


def _latest(storage: CheckpointStorage, expected: int | None, floor: int = 0) -> tuple[str | None, str | None]:
    """:func:`~sluice.checkpoint.history.latest_checkpoint`, its metadata read (a refusal names it)."""
    path, older = latest_checkpoint(storage, expected, floor)
    if path is not None:
        try:
            storage.read_metadata_at(path)
        except RestoreError as exc:
            raise refused(f"the job's newest completed checkpoint {path} cannot be restored: {exc}", older) from None
    return path, older


def _load(cfg: JobConfig, storage: CheckpointStorage, path: str) -> RestoredCheckpoint:
    restored = RestoredCheckpoint.load(storage, path, key=cfg.checkpoint.resolved_key())
    if restored.checkpoint_id == cfg.recover_without_channel_state:
        log.warning("restoring checkpoint %s WITHOUT its channel state: its in-flight data is lost", path)
        restored.drop_channel_state = True
    return restored


def run_job(
    job: JobGraph,
    cfg: JobConfig,
    run_attempt: Callable[[JobAttempt, FaultHook], None],
    faults: FaultHook = NO_FAULTS,
    on_attempt: Callable[[JobAttempt], None] | None = None,
    lifecycle: JobLifecycle | None = None,
) -> JobResult:
    """Run ``job`` with failover: each attempt restores and runs until it finishes, fails or is cancelled.

    ``lifecycle`` holds the job's :class:`~sluice.runtime.status.JobStatus` (a client cancels through it);
    the result's status is where it ended: finished or cancelled. A job that fails for good raises
    JobFailedError; an error a restart cannot cure (``sluice.errors.is_recoverable``: a wrong option, a bad
    record, a checkpoint that cannot be restored) is raised as it is, at once, without spending restarts.
    """
    status = lifecycle or JobLifecycle(cfg.job_id)
    attempts = _AttemptLog(cfg.checkpoint.history_size)

    def one_attempt(storage: CheckpointStorage) -> None:
        if not status.advance(JobStatus.RUNNING):
            return  # cancelled before this attempt began
        n = attempts.begin()
        try:
            restored = resolve_restore(cfg, storage, n, attempts.run)
        except SluiceError as exc:
            if not is_recoverable(exc):
                raise  # a checkpoint that cannot be restored: as it is, at once
            attempts.failures.append(f"attempt {n}: {type(exc).__name__}: {exc}")
            raise AttemptFailedError(f"{type(exc).__name__}: {exc}") from exc
        except OSError as exc:  # the storage failed beyond its retries: a restart may find it back
            attempts.failures.append(f"attempt {n}: {type(exc).__name__}: {exc}")
            raise AttemptFailedError(f"{type(exc).__name__}: {exc}") from exc
        if n == 0 and restored is not None:
            attempts.run.first = restored.path
            attempts.run.latest = None if "savepoint-" in restored.path else restored.checkpoint_id
        if restored is not None:
            restored.check_compatible(job, cfg.allow_non_restored_state, cfg.allow_changed_operators)
        a = JobAttempt(job, cfg, storage, n, restored)
        a.faults = faults
        if on_attempt is not None:
            on_attempt(a)
        status.on_cancel(a.cancel)
        try:
            a.recover_sinks()
            run_attempt(a, faults)
        except BaseException as exc:
            if a.failure is None:
                a.failure = exc
        finally:
            status.on_cancel(None)
            a.stop()  # never raises: what fails while cleaning up is attached to the failure
            attempts.record(a)
        if a.cancelled:
            status.cancel()  # the runtime was cancelled directly: the job ends cancelled all the same
        elif a.failure is not None:
            attempts.failures.append(f"attempt {n}: {a.failure_text()}")
        if a.failure is None or status.status is JobStatus.CANCELLING:
            return  # finished, or cancelled: no restart either way
        if isinstance(a.failure, (ConfigError, GraphError, RestoreError)):
            raise a.failure  # the job's definition is wrong: raised as it is, as when the job is built
        if not is_recoverable(a.failure):
            raise _Unrecoverable(a.failure_text()) from a.failure
        raise AttemptFailedError(a.failure_text()) from a.failure

    try:
        storage = storage_for(cfg.checkpoint, cfg.job_id)
        retrying = cfg.restart.retrying(AttemptFailedError).copy(
            before_sleep=lambda _: status.advance(JobStatus.RESTARTING), sleep=status.sleep
        )
        for attempt in retrying:
            with attempt:
                one_attempt(storage)
    except BaseException as exc:
        if status.advance(JobStatus.FAILING):  # else a cancel came first: the job ends cancelled
            status.transition(JobStatus.FAILED)
            if not isinstance(exc, AttemptFailedError | _Unrecoverable):
                raise
            cause = exc.__cause__ or exc
            if isinstance(exc, _Unrecoverable):
                raise JobFailedError(
                    f"job {cfg.job_id!r} failed at once (a restart cannot cure this): {exc}"
                ) from cause
            raise JobFailedError(
                f"job {cfg.job_id!r} failed after {attempts.count} attempt(s); root cause: {exc}"
            ) from cause
    if status.status is JobStatus.STOPPING:
        status.transition(JobStatus.STOPPED)
    elif not status.advance(JobStatus.FINISHED):
        status.transition(JobStatus.CANCELLED)
    return attempts.result(cfg.job_id, status.status)


class _Unrecoverable(SluiceError):
    """An attempt failed with an error a restart cannot cure (``sluice.errors.is_recoverable``); not an
    :class:`AttemptFailedError`, so the restart strategy (which retries only those) lets it through."""


class _AttemptLog:
    """What a job keeps across its attempts: how many ran, their failures, checkpoints and metrics."""

    def __init__(self, history_size: int) -> None:
        self.count = 0
        self.failures: list[str] = []
        self.checkpoints: deque[CheckpointStats] = deque(maxlen=history_size)
        self.counts: list[CheckpointCounts] = []
        self.last_checkpoint: int | None = None
        self.stopped_at: str | None = None
        self.metrics: dict[str, int] = {}
        self.vertex_metrics: dict[str, dict[str, Any]] = {}
        self.run = RunRestore()

    def begin(self) -> int:
        """Count an attempt in; returns its number (0 first)."""
        self.count += 1
        return self.count - 1

    def record(self, a: JobAttempt) -> None:
        """Keep what an ended attempt's coordinator and tasks report."""
        if a.coordinator is not None:
            self.checkpoints.extend(a.coordinator.history)
            self.counts.append(a.coordinator.stats.counts)
            if a.coordinator.completed:
                self.last_checkpoint = a.coordinator.completed[-1][0]
                self.run.latest = max(self.run.latest or 0, self.last_checkpoint)
            self.stopped_at = a.coordinator.terminal_path or self.stopped_at
        counted = [dict(a.metrics)]  # the driver side: global commits
        counted += [ctx.metrics for t in a.tasks.values() for ctx in getattr(t, "contexts", [])]
        for metrics in counted:
            for k, v in metrics.items():
                self.metrics[k] = self.metrics.get(k, 0) + v
        merge_attempt(self.vertex_metrics, vertex_totals(a.job, a.tasks))

    def result(self, job_id: str, status: JobStatus) -> JobResult:
        return JobResult(
            job_id,
            status,
            self.count,
            self.last_checkpoint,
            list(self.checkpoints),
            self.metrics,
            self.failures,
            self.stopped_at,
            self.vertex_metrics,
            CheckpointCounts.total(self.counts),
        )
