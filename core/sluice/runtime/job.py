"""Running a job: the restart strategy around attempts, and which checkpoint each attempt restores.

``run_job`` applies the restart strategy (tenacity) around attempts. An attempt loads the checkpoint to
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
from sluice.errors import ConfigError, JobFailedError, RestoreError
from sluice.events import AlignmentMode
from sluice.graph import JobGraph
from sluice.runtime.attempt import AttemptCancelled, AttemptFailedError, JobAttempt
from sluice.runtime.fault_hook import NO_FAULTS, FaultHook
from sluice.runtime.restore import RestoredCheckpoint

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

    def alignment(self) -> AlignmentMode:
        c = self.checkpoint
        if c.mode == "at_least_once":
            return AlignmentMode.AT_LEAST_ONCE
        if c.aligned_checkpoint_timeout is not None:
            return AlignmentMode.ADAPTIVE
        if c.unaligned:
            return AlignmentMode.UNALIGNED
        return AlignmentMode.ALIGNED


@dataclass
class JobResult:
    """What a finished (or cancelled) job reports."""

    job_id: str
    status: str
    attempts: int
    last_checkpoint: int | None
    checkpoints: list[CheckpointStats]
    metrics: dict[str, int]
    failures: list[str]


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
    drop = (
        cfg.recover_without_channel_state is not None
        and int(meta["checkpoint_id"]) == cfg.recover_without_channel_state
    )
    if drop:
        log.warning("restoring checkpoint %s WITHOUT its channel state: its in-flight data is lost", path)
    return RestoredCheckpoint.load(storage, path, drop_channel_state=drop)


def run_job(
    job: JobGraph,
    cfg: JobConfig,
    run_attempt: Callable[[JobAttempt, FaultHook], None],
    faults: FaultHook = NO_FAULTS,
    on_attempt: Callable[[JobAttempt], None] | None = None,
) -> JobResult:
    """Run ``job`` with failover: each attempt restores and runs until it finishes, fails or is cancelled."""
    storage = checkpoint_storage(cfg.checkpoint.storage, cfg.job_id, **cfg.checkpoint.storage_options)
    state: dict[str, Any] = {"attempt": 0, "failures": [], "history": [], "last": None, "metrics": {}}

    def one_attempt() -> None:
        n = state["attempt"]
        state["attempt"] += 1
        restored = resolve_restore(cfg, storage, n)
        if restored is not None:
            restored.check_compatible(job, cfg.allow_non_restored_state)
        a = JobAttempt(job, cfg, storage, n, restored)
        a.faults = faults
        if on_attempt is not None:
            on_attempt(a)
        try:
            a.recover_sinks()
            run_attempt(a, faults)
        except BaseException as exc:
            if a.failure is None:
                a.failure = exc
        finally:
            a.stop()
            if a.coordinator is not None:
                state["history"].extend(a.coordinator.history)
                if a.coordinator.completed:
                    state["last"] = a.coordinator.completed[-1][0]
            for t in a.tasks.values():
                for ctx in getattr(t, "contexts", []):
                    for k, v in ctx.metrics.items():
                        state["metrics"][k] = state["metrics"].get(k, 0) + v
        if a.failure is not None and not isinstance(a.failure, AttemptCancelled):
            state["failures"].append(f"attempt {n}: {a.failure_text()}")
            if isinstance(a.failure, (RestoreError, ConfigError)):
                raise a.failure  # a restart cannot fix these
            raise AttemptFailedError(a.failure_text()) from a.failure

    try:
        for attempt in cfg.restart.retrying(AttemptFailedError):
            with attempt:
                one_attempt()
    except AttemptFailedError as exc:
        cause = exc.__cause__ or exc
        raise JobFailedError(
            f"job {cfg.job_id!r} failed after {state['attempt']} attempt(s); root cause: {exc}"
        ) from cause
    return JobResult(
        cfg.job_id,
        "finished",
        state["attempt"],
        state["last"],
        state["history"],
        state["metrics"],
        state["failures"],
    )
