"""Running a job: the restart strategy around attempts, and which checkpoint each attempt restores.

``run_job`` applies the restart strategy (tenacity) around attempts and moves the job's
:class:`~sluice.runtime.status.JobStatus` along its table (created, running, restarting, ... finished). An attempt loads the checkpoint to
restore (the user's, or the latest completed one after a failure), lets sinks clean up what later,
unfinished checkpoints left behind, re-commits the restored committables, starts the coordinator and the
source enumerators (:class:`~sluice.runtime.attempt.JobAttempt`). The runtime (in-process or Spark) only
supplies channels, threads or processes (:mod:`sluice.runtime.assembly` builds the tasks).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sluice.checkpoint.stats import CheckpointStats
from sluice.checkpoint.storage import CheckpointStorage, checkpoint_storage
from sluice.config import CheckpointConfig, FixedDelayRestart, RestartStrategy
from sluice.errors import ConfigError, GraphError, JobFailedError, RestoreError, SluiceError, is_recoverable
from sluice.events import AlignmentMode
from sluice.graph import JobGraph
from sluice.runtime.attempt import AttemptFailedError, JobAttempt
from sluice.runtime.fault_hook import NO_FAULTS, FaultHook
from sluice.runtime.restore import RestoredCheckpoint
from sluice.runtime.status import JobLifecycle, JobStatus
from sluice.runtime.task_metrics import merge_attempt, vertex_totals

__all__ = ["JobConfig", "JobResult", "run_job"]

log = logging.getLogger("sluice.job")


@dataclass(frozen=True)
class JobConfig:
    """How to run a job (built and validated by ``Pipeline``)."""

    job_id: str
    checkpoint: CheckpointConfig
    restart: RestartStrategy = field(default_factory=lambda: FixedDelayRestart(attempts=3, delay=1.0))
    buffers_per_channel: int = 4
    max_batch_rows: int = 0
    #: "latest" (resume from the latest completed checkpoint if any), "none", or a checkpoint path
    restore: str = "latest"
    recover_without_channel_state: int | None = None
    #: restore even if the checkpoint holds state of operator uids the job no longer has (that state is dropped)
    allow_non_restored_state: bool = False
    #: run even if a sink's output holds checkpoints newer than the restored one (their data comes again)
    allow_reprocessing: bool = False
    #: count the tasks' built-in metrics (records, bytes, busy and backpressured time; see docs/operations.md)
    metrics: bool = True

    def alignment(self) -> AlignmentMode:
        """How the job's tasks align their (non-savepoint) checkpoints."""
        return self.checkpoint.options().alignment


@dataclass
class JobResult:
    """What a finished (or cancelled) job reports.

    Attributes:
        status: ``JobStatus.FINISHED`` or ``JobStatus.CANCELLED`` (a string enum: ``== "finished"`` holds).
        attempts: attempts run (restarts + 1).
        last_checkpoint: id of the last completed checkpoint, if any.
        checkpoints: statistics of every checkpoint of every attempt.
        metrics: task and global-committer metrics summed over subtasks and attempts.
        failures: one line per failed attempt.
        stopped_at: the path of the job's last checkpoint or savepoint if it was stopped (``stopped``).
        vertex_metrics: per vertex (by name), its subtasks' built-in metrics summed over attempts: records,
            bytes and batches in and out, busy / idle / backpressured seconds, side-output rows (dead
            letters), counters and gauges (see :mod:`sluice.runtime.task_metrics`); empty if the job ran
            without metrics.
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


def resolve_restore(cfg: JobConfig, storage: CheckpointStorage, attempt: int) -> RestoredCheckpoint | None:
    """Which checkpoint an attempt restores: after a failure the latest completed one; at the start what
    the user asked for (``latest`` resumes a previous run of the same job id)."""
    if attempt > 0 or cfg.restore == "latest":
        latest = storage.latest()
        if latest is not None:
            return _load(cfg, storage, latest)
        if attempt > 0 and cfg.restore not in ("latest", "none"):
            return _load(cfg, storage, cfg.restore)
        return None
    if cfg.restore == "none":
        return None
    return _load(cfg, storage, cfg.restore)


def _load(cfg: JobConfig, storage: CheckpointStorage, path: str) -> RestoredCheckpoint:
    try:
        meta = storage.read_metadata_at(path)
    except FileNotFoundError as exc:
        raise RestoreError(f"no checkpoint at {path}") from exc
    except ValueError as exc:  # not JSON (a planted or truncated file)
        raise RestoreError(f"{path.rstrip('/')}/_metadata is not a sluice checkpoint metadata file: {exc}") from None
    drop = (
        cfg.recover_without_channel_state is not None
        and int(meta["checkpoint_id"]) == cfg.recover_without_channel_state
    )
    if drop:
        log.warning("restoring checkpoint %s WITHOUT its channel state: its in-flight data is lost", path)
    return RestoredCheckpoint.load(storage, path, drop_channel_state=drop, key=cfg.checkpoint.resolved_key())


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
    attempts = _AttemptLog()

    def one_attempt(storage: CheckpointStorage) -> None:
        if not status.advance(JobStatus.RUNNING):
            return  # cancelled before this attempt began
        n = attempts.begin()
        restored = resolve_restore(cfg, storage, n)
        if restored is not None:
            restored.check_compatible(job, cfg.allow_non_restored_state)
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
            a.stop()
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
        storage = checkpoint_storage(cfg.checkpoint.storage, cfg.job_id, **cfg.checkpoint.storage_options)
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

    def __init__(self) -> None:
        self.count = 0
        self.failures: list[str] = []
        self.checkpoints: list[CheckpointStats] = []
        self.last_checkpoint: int | None = None
        self.stopped_at: str | None = None
        self.metrics: dict[str, int] = {}
        self.vertex_metrics: dict[str, dict[str, Any]] = {}

    def begin(self) -> int:
        """Count an attempt in; returns its number (0 first)."""
        self.count += 1
        return self.count - 1

    def record(self, a: JobAttempt) -> None:
        """Keep what an ended attempt's coordinator and tasks report."""
        if a.coordinator is not None:
            self.checkpoints.extend(a.coordinator.history)
            if a.coordinator.completed:
                self.last_checkpoint = a.coordinator.completed[-1][0]
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
            self.checkpoints,
            self.metrics,
            self.failures,
            self.stopped_at,
            self.vertex_metrics,
        )
