"""The control plane of one attempt: coordinator, source enumerators, and the reports tasks send.

:class:`JobAttempt` implements :class:`~sluice.runtime.task.TaskGateway`: tasks (in-process) or the Spark
driver's control server (for slots) call it to acknowledge or decline checkpoints, report end of input,
finish, fail, or ask their enumerator for splits.

Root cause first: the first failure of an attempt is its root cause (``failure``); failures after it are
attached (``secondary_failures``), never substituted. A runtime that learns of failures over several
connections cannot rely on arrival order alone, so each failure comes with a :class:`FailureKind`: an
error a part of the job reported outranks a part that vanished without a report, which outranks a failure
known to be a consequence of another. The root cause is the first failure of the best rank.

Cleaning up never replaces the cause: a failure while discarding a checkpoint, closing an enumerator, a
committer or the commit queue is logged and attached to the attempt's failure (``secondary_failures``);
an attempt that succeeded only logs it. :meth:`JobAttempt.stop` never raises.
"""

from __future__ import annotations

import enum
import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from sluice.checkpoint.codec import MetadataCodec
from sluice.checkpoint.coordinator import (
    CheckpointCoordinator,
    CoordinatedTasks,
    CoordinatorServices,
    ResumePoint,
)
from sluice.checkpoint.global_commit import GlobalCommitQueue
from sluice.checkpoint.history import highest_id
from sluice.checkpoint.shared_state import recover_shared_state
from sluice.checkpoint.storage import CheckpointStorage
from sluice.config.job import JobConfig
from sluice.errors import CheckpointFailureReason, SluiceError
from sluice.graph import JobGraph, NodeKind, SubtaskId
from sluice.operators.committables import commit_with_retry
from sluice.runtime.enumerators import SourceEnumerators
from sluice.runtime.fault_hook import NO_FAULTS, FaultHook
from sluice.runtime.lineage import check_sink_lineage
from sluice.runtime.restore import RestoredCheckpoint
from sluice.runtime.upgrades import operator_configs
from sluice.sink import GlobalCommitter, Sink

__all__ = ["AttemptCancelled", "AttemptFailedError", "FailureKind", "JobAttempt"]

log = logging.getLogger("sluice.job")


class AttemptCancelled(Exception):
    """Set as :attr:`JobAttempt.failure` when the job is cancelled (:meth:`JobAttempt.cancel`): a signal,
    not an error. The attempt ends and no restart follows."""


class AttemptFailedError(SluiceError):
    """An attempt failed; ``__cause__`` is the root cause. The restart strategy decides what follows."""


class FailureKind(enum.IntEnum):
    """How a failure reached the attempt, best root-cause evidence first (see the module docstring)."""

    #: the part that failed reported the error itself (a task raised, the coordinator gave up)
    REPORTED = 0
    #: a part of the job vanished without a report (its process died, its connection broke)
    LOST = 1
    #: caused by another failure (a slot that lost a peer, a Spark stage that failed after a slot did)
    CONSEQUENCE = 2


class JobAttempt:
    """The control plane of one attempt: coordinator, enumerators, task reports. Implements TaskGateway."""

    def __init__(
        self,
        job: JobGraph,
        cfg: JobConfig,
        storage: CheckpointStorage,
        attempt: int,
        restored: RestoredCheckpoint | None,
    ) -> None:
        self.job = job
        self.cfg = cfg
        self.storage = storage
        self.attempt = attempt
        self.restored = restored
        self.tasks: dict[SubtaskId, Any] = {}
        self.lock = threading.RLock()
        #: the root cause: the first failure of the best :class:`FailureKind`
        self.failure: BaseException | None = None
        self.failed_task: SubtaskId | None = None
        #: every other failure of the attempt, in the order they arrived
        self.secondary_failures: list[BaseException] = []
        self._root_kind: FailureKind | None = None
        self._failures: list[tuple[BaseException, SubtaskId | None, FailureKind]] = []
        self.finished_tasks: set[SubtaskId] = set()
        self.done = threading.Event()
        self.sources = SourceEnumerators(job, attempt, self.remote, self.lock, self.done, self._enumerator_failed)
        #: the sources' split enumerators, by source uid
        self.enumerators: dict[str, Any] = self.sources.enumerators
        self.coordinator: CheckpointCoordinator | None = None
        self.metrics: dict[str, int] = {}
        self.global_committers: dict[str, GlobalCommitter[Any]] = {}
        self.global_commits: GlobalCommitQueue | None = None
        #: seconds each global commit took, per sink uid (in checkpoint order)
        self.commit_latencies: dict[str, list[float]] = {}
        self.faults: FaultHook = NO_FAULTS
        #: the highest checkpoint id a sink's output holds beyond the restored one (allow_reprocessing)
        self.checkpoint_floor = 0

    # -- setup -----------------------------------------------------------------------------------------
    def recover_sinks(self) -> None:
        """Before tasks start: sinks abort leftovers of unfinished checkpoints; global commits are redone."""
        r = self.restored
        self.checkpoint_floor = check_sink_lineage(self.job, self.cfg, self.storage, r)  # before any write
        for node in self.job.logical.nodes.values():
            if node.kind is not NodeKind.SINK:
                continue
            sink: Sink[Any] = node.spec
            comms = r.sink_committables(node.uid, sink) if r is not None else []
            sink.recover(self.cfg.job_id, comms)
            gc = (
                sink.create_global_committer(_GlobalCommitterCtx(self, node.uid))
                if sink.global_commit
                else None
            )
            if gc is None:
                continue
            self.global_committers[node.uid] = gc
            if r is not None:  # every checkpoint whose commit the restored one could not see return, in order
                for cid, comms in r.global_committables(node.uid, sink.committable_serializer()):
                    self._global_commit(node.uid, gc, cid, comms)

    def metric(self, name: str, increment: int = 1) -> None:
        """Count ``name`` in the attempt's metrics (the driver side: global commits, enumerators)."""
        with self.lock:
            self.metrics[name] = self.metrics.get(name, 0) + increment

    def remote(self, task: SubtaskId) -> Any:
        return self.tasks[task]

    def register(self, task: SubtaskId, handle: Any) -> None:
        self.tasks[task] = handle

    def start_control(self) -> None:
        """Create enumerators and the coordinator; register readers. Call after tasks are registered."""
        r = self.restored
        source_tasks = self.sources.create(r)
        self.global_commits = GlobalCommitQueue(
            {
                name: functools.partial(self._global_commit, name, gc)
                for name, gc in self.global_committers.items()
            },
            on_fatal=lambda exc: self.failed(None, exc),
            observe=self._commit_latency,
        )
        job_info = {
            "job_id": self.cfg.job_id,
            "attempt": self.attempt,
            "max_parallelism": self.job.max_parallelism,
            "vertices": {
                v.uid: {
                    "name": v.name,
                    "parallelism": v.parallelism,
                    "inputs": [e.partitioning.value for e in v.inputs],
                }
                for v in self.job.vertices.values()
            },
            "operators": operator_configs(self.job),
        }
        next_id = (r.checkpoint_id + 1) if r is not None else 1
        prior = highest_id(self.storage)
        next_id = max(next_id, prior + 1, self.checkpoint_floor + 1)
        restored = (r.checkpoint_id, r.path) if r is not None and "savepoint-" not in r.path else None
        key = self.cfg.checkpoint.resolved_key()
        self.coordinator = CheckpointCoordinator(
            self.cfg.checkpoint,
            CoordinatedTasks(self.tasks, source_tasks, self.enumerators, self.lock),
            CoordinatorServices(
                self.storage,
                job_info,
                codec=MetadataCodec.for_job(self.job, key),
                global_commits=self.global_commits,
                on_fatal=lambda exc: self.failed(None, exc),
                on_cleanup_failure=self._cleanup_failed,
            ),
            ResumePoint(next_id, restored, committed_upto=r.checkpoint_id if r is not None else 0),
        )
        # before the first checkpoint: shared files of the retained checkpoints counted, orphans deleted
        in_place = r is not None and not r.foreign and restored is not None
        recover_shared_state(
            self.coordinator.store, key, (r.checkpoint_id, r.shared_refs()) if in_place and r else None
        )
        self.sources.start(r)
        self.coordinator.start()
        self.sources.start_polling()

    def _global_commit(
        self, uid: str, gc: GlobalCommitter[Any], checkpoint_id: int, committables: list[Any]
    ) -> None:
        self.faults.hit("global_commit", f"global committer of {uid}")
        commit_with_retry(uid, gc.commit, checkpoint_id, committables, metric=self.metric)

    def _commit_latency(self, uid: str, seconds: float) -> None:
        with self.lock:
            self.commit_latencies.setdefault(uid, []).append(seconds)

    def _enumerator_failed(self, error: BaseException) -> None:
        self.failed(None, error)

    # -- TaskGateway -----------------------------------------------------------------------------------
    def acknowledge(self, task: SubtaskId, checkpoint_id: int, handle: dict[str, Any]) -> None:
        if self.coordinator is not None:
            self.coordinator.acknowledge(task, checkpoint_id, handle)

    def decline(
        self,
        task: SubtaskId,
        checkpoint_id: int,
        reason: str,
        failure: CheckpointFailureReason = CheckpointFailureReason.DECLINED,
    ) -> None:
        if self.coordinator is not None:
            self.coordinator.decline(task, checkpoint_id, reason, failure)

    def end_of_input(self, task: SubtaskId) -> None:
        if self.coordinator is not None:
            self.coordinator.end_of_input(task)

    def finished(self, task: SubtaskId) -> None:
        if self.coordinator is not None:
            self.coordinator.task_finished(task)
        with self.lock:
            self.finished_tasks.add(task)
            if len(self.finished_tasks) == len(self.tasks):
                self.done.set()

    def failed(
        self, task: SubtaskId | None, error: BaseException, kind: FailureKind = FailureKind.REPORTED
    ) -> None:
        """Record a failure and end the attempt.

        Args:
            task: the subtask that failed, or None (the job, a slot, the runtime).
            error: the failure.
            kind: how it reached the attempt. It becomes the root cause if it is the first failure, or
                if it outranks the root cause so far; otherwise it is attached to it.
        """
        with self.lock:
            if self.failure is not None and self._root_kind is None:
                self.secondary_failures.append(error)  # the runtime set the failure (e.g. cancelled)
            else:
                self._rank(task, error, kind)
        self.done.set()

    def _rank(self, task: SubtaskId | None, error: BaseException, kind: FailureKind) -> None:
        self._failures.append((error, task, kind))
        best = min(range(len(self._failures)), key=lambda i: (self._failures[i][2], i))
        root, root_task, self._root_kind = self._failures[best]
        self.secondary_failures = [f[0] for i, f in enumerate(self._failures) if i != best]
        if root is not self.failure:
            self.failure, self.failed_task = root, root_task
            log.warning("attempt %d: %s failed: %s", self.attempt, task or "job", error)
        else:
            log.info("attempt %d: after its root cause, %s failed: %s", self.attempt, task or "job", error)

    def failure_text(self) -> str:
        """The root cause, then the failures attached to it: ``Type: message; also failed: Type: ...``."""
        with self.lock:
            if self.failure is None:
                return ""
            text = f"{type(self.failure).__name__}: {self.failure}"
            others = [f"{type(e).__name__}: {_first_line(e)}" for e in self.secondary_failures]
        return text + ("; also failed: " + "; ".join(others) if others else "")

    def request_split(self, task: SubtaskId) -> None:
        self.sources.request_split(task)

    # -- outcome and teardown --------------------------------------------------------------------------
    def cancel(self) -> None:
        """The job is cancelled: end this attempt (the runtime cancels its tasks); no restart follows."""
        with self.lock:
            if self.failure is None:
                self.failure = AttemptCancelled("cancelled")
        self.done.set()

    @property
    def cancelled(self) -> bool:
        return isinstance(self.failure, AttemptCancelled)

    @property
    def succeeded(self) -> bool:
        """Every task finished (after its final checkpoint) and nothing failed."""
        return self.failure is None and len(self.finished_tasks) == len(self.tasks)

    def stop(self) -> None:
        """End the attempt's control plane: drain commits if it succeeded, abort pending checkpoints, close
        enumerators and committers. Never raises: a failure here is attached to the attempt's failure."""
        self.done.set()
        if self.global_commits is not None:
            if self.succeeded:
                try:
                    self.global_commits.drain()  # a finished job has committed everything (or failed here)
                except Exception as exc:
                    self.failed(None, exc)
            self._cleanup("closing the global commit queue", self.global_commits.close)
        if self.coordinator is not None:
            reason = (
                CheckpointFailureReason.FINISHED if self.succeeded else CheckpointFailureReason.JOB_FAILOVER
            )
            if self.cancelled:
                reason = CheckpointFailureReason.JOB_CANCELLED
            self._cleanup("stopping the checkpoint coordinator", functools.partial(self.coordinator.stop, reason))
        for uid, e in self.enumerators.items():
            self._cleanup(f"closing the enumerator of {uid}", e.close)
        for uid, gc in self.global_committers.items():
            self._cleanup(f"closing the global committer of {uid}", gc.close)

    def _cleanup(self, what: str, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except Exception as exc:
            self._cleanup_failed(what, exc)

    def _cleanup_failed(self, what: str, error: BaseException) -> None:
        """``what`` failed while cleaning up: attached to the attempt's failure, or only logged if it has none
        (cleaning up after a success never fails the job)."""
        with self.lock:
            attach = self.failure is not None
            if attach:  # ranked last: never the root cause
                self.failed(None, error, FailureKind.CONSEQUENCE)
        log.warning(
            "attempt %d: %s failed%s: %s: %s",
            self.attempt, what, " (attached to the attempt's failure)" if attach else "",
            type(error).__name__, error,
        )  # fmt: skip


def _first_line(error: BaseException, limit: int = 300) -> str:
    text = str(error).strip()
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


class _GlobalCommitterCtx:
    """GlobalCommitterContext of one sink in one attempt."""

    def __init__(self, attempt: JobAttempt, sink_uid: str) -> None:
        self._a = attempt
        self._uid = sink_uid

    @property
    def job_id(self) -> str:
        return self._a.cfg.job_id

    @property
    def sink_uid(self) -> str:
        return self._uid

    @property
    def attempt(self) -> int:
        return self._a.attempt

    @property
    def restored_checkpoint_id(self) -> int | None:
        return self._a.restored.checkpoint_id if self._a.restored is not None else None

    def metric(self, name: str, increment: int = 1) -> None:
        self._a.metric(name, increment)

    def fault_hook(self, point: str) -> None:
        self._a.faults.hit(point, f"global committer of {self._uid}")
