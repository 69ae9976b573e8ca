"""The checkpoint coordinator: triggers checkpoints, collects acknowledgements, completes or aborts them.

Runs in the driver. A checkpoint n goes: trigger (enumerator snapshots, barriers injected at the source
tasks and at tasks whose inputs all ended) -> every running task acknowledges with a state handle ->
metadata written **last** and atomically (:class:`~sluice.checkpoint.pending.PendingCheckpoint`) -> the
retained checkpoints and the job's index of them
(:class:`~sluice.checkpoint.completed_store.CompletedCheckpointStore`) -> global committables to the ordered commit queue (:mod:`~sluice.checkpoint.global_commit`) -> tasks
notified ``checkpoint_complete(n)`` -> checkpoints beyond ``num_retained`` deleted. A checkpoint that
expires or is declined is aborted: tasks get ``checkpoint_aborted(n)``, its files are deleted (again after
a late write) and the failure goes into the stats history; consecutive failures are counted by the
:class:`~sluice.checkpoint.failure_manager.CheckpointFailureManager`. A failure to delete files is
reported (``on_cleanup_failure``), never raised.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

from sluice.checkpoint.codec import MetadataCodec
from sluice.checkpoint.completed_store import CompletedCheckpointStore
from sluice.checkpoint.coordinator_setup import CoordinatedTasks, CoordinatorServices, ResumePoint
from sluice.checkpoint.failure_manager import CheckpointFailureManager
from sluice.checkpoint.handles import AckResult, TaskHandle
from sluice.checkpoint.pending import CompletedCheckpoint, FinalizeError, PendingCheckpoint
from sluice.checkpoint.state_files import FinishedKeyedState, refs_of
from sluice.checkpoint.stats import CheckpointStats, CheckpointStatsTracker
from sluice.checkpoint.stats_log import CheckpointStatsLog
from sluice.config import CheckpointConfig
from sluice.errors import CheckpointError, CheckpointFailureReason
from sluice.events import AlignmentMode, CheckpointBarrier, CheckpointKind, CheckpointOptions
from sluice.graph import SubtaskId

__all__ = [
    "AckResult",
    "CheckpointCoordinator",
    "CoordinatedTasks",
    "CoordinatorServices",
    "ResumePoint",
    "TaskHandle",
]

log = logging.getLogger("sluice.checkpoint")

#: aborted checkpoints remembered for late writers (their files are deleted when they arrive)
_ABORTED_KEPT = 1000


class CheckpointCoordinator:
    """Drives checkpoints of one job attempt.

    Args:
        config: The job's checkpoint configuration.
        tasks: The subtasks and enumerators it drives.
        services: Storage, metadata codec, commit queue and failure callbacks.
        resume: Where its checkpoints go on from (default: a fresh start, checkpoint 1).
    """

    def __init__(
        self,
        config: CheckpointConfig,
        tasks: CoordinatedTasks,
        services: CoordinatorServices,
        resume: ResumePoint | None = None,
    ) -> None:
        resume = resume or ResumePoint()
        self.config = config
        self.storage = services.storage
        self.tasks = tasks.tasks
        self.source_tasks = tasks.sources
        self.job_info = services.job_info
        self.next_id = resume.next_checkpoint_id
        self.enumerators = tasks.enumerators
        self.lock = tasks.lock
        self.global_commits = services.global_commits
        self.on_fatal = services.on_fatal
        self.codec = services.codec or MetadataCodec(config.resolved_key())
        self.pending: dict[int, PendingCheckpoint] = {}
        self.ended: set[SubtaskId] = set()
        self.finished: dict[SubtaskId, dict[str, Any]] = {}
        self.last_handles: dict[SubtaskId, dict[str, Any]] = {}
        self.completed_handles: dict[SubtaskId, dict[str, Any]] = {}
        self.on_cleanup_failure = services.on_cleanup_failure
        #: retained completed checkpoints, the job's index of them, discards (never raising)
        self.store = CompletedCheckpointStore(
            self.storage, config.num_retained, resume.restored, self.on_cleanup_failure, services.shared_state
        )
        self._aborted: dict[int, bool] = {}  # aborted checkpoint -> savepoint: late writers are cleaned up
        #: the newest ``history_size`` checkpoints' statistics, in memory and on storage, and totals
        self.stats = CheckpointStatsTracker(
            CheckpointStatsLog(self.storage, config.history_size).record, self.on_cleanup_failure, config.history_size
        )
        #: the last checkpoint whose committables went to the global committers (restored one after a restore)
        self.committed_upto = resume.committed_upto
        self.failures = CheckpointFailureManager(config.tolerable_failed_checkpoints, self.on_fatal)
        self.last_completed_at = 0.0
        self._stopped = threading.Event()
        #: while set, only the terminal checkpoint of stop-with-savepoint is triggered (with these options)
        self._terminal: CheckpointOptions | None = None
        #: the path of the terminal checkpoint once it completed
        self.terminal_path: str | None = None
        self._thread: threading.Thread | None = None
        self._wanted = threading.Event()  # a trigger was requested (end of input)
        self._wake = threading.Event()  # wakes the trigger loop: a request, or a pending checkpoint ended

    def start(self) -> None:
        self.store.sweep_dead_attempts(self.next_id)  # what killed attempts left: their close never ran
        self._thread = threading.Thread(target=self._loop, name="checkpoint-coordinator", daemon=True)
        self._thread.start()

    @property
    def completed(self) -> list[tuple[int, str]]:  # retained, oldest first
        return self.store.completed

    @property
    def history(self) -> deque[CheckpointStats]:  # the attempt's newest checkpoints, in trigger order
        return self.stats.history

    def stop(self, reason: CheckpointFailureReason = CheckpointFailureReason.JOB_FAILOVER) -> None:
        """Stop triggering; pending checkpoints are aborted with ``reason`` and their files deleted (waiting
        up to the storage's retry time), as are folders of earlier checkpoints that never completed."""
        self._stopped.set()
        self._wake.set()
        with self.lock:
            for cid in list(self.pending):
                self._abort(cid, reason, "", notify=False)
        self.store.close(self.storage.retry_timeout + 10.0)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)

    def _loop(self) -> None:
        interval = self.config.interval if self.config.interval is not None else float("inf")
        next_at = time.monotonic() + interval
        while not self._stopped.is_set():
            now = time.monotonic()
            # sleep until the next trigger is due, a trigger is requested or a pending checkpoint ends; the
            # 50 ms cap keeps expiry checks going (and a due-but-blocked trigger never spins)
            self._wake.wait(min(max(next_at - now, 0.0), 0.05) if now < next_at else 0.05)
            self._wake.clear()
            if self._stopped.is_set():
                return
            if self._wanted.is_set():
                self._wanted.clear()
                self._try_trigger(forced=True)
            now = time.monotonic()
            self._expire(now)
            if now < next_at:
                continue
            earliest = self.last_completed_at + self.config.min_pause
            if now < earliest:
                next_at = earliest  # min_pause delays the trigger, it does not skip it
            elif self._terminal is not None or self._try_trigger(forced=False) is not None or not self.pending:
                next_at = now + interval

    def request_checkpoint(self) -> None:
        """Trigger a checkpoint as soon as allowed (end of input)."""
        self._wanted.set()
        self._wake.set()

    # -- triggering ----------------------------------------------------------------------------------
    def _options(self, savepoint: bool) -> CheckpointOptions:
        return self.config.options(savepoint)

    def _try_trigger(self, forced: bool, savepoint: bool = False) -> int | None:
        with self.lock:
            if self._stopped.is_set():
                return None
            running = [t for t in self.tasks if t not in self.finished]
            if not running:
                return None
            if len(self.pending) >= self.config.max_concurrent:
                return None
            if not forced and time.monotonic() - self.last_completed_at < self.config.min_pause:
                return None
            if self.terminal_path is not None:
                return None  # the job stopped: its terminal checkpoint is the last one
            opts = self._terminal or self._options(savepoint)
            if opts.alignment is not AlignmentMode.ALIGNED and any(
                p.barrier.options.alignment in (AlignmentMode.UNALIGNED, AlignmentMode.ADAPTIVE)
                for p in self.pending.values()
            ):
                return None  # at most one unaligned checkpoint in flight
            return self._trigger(opts)

    def trigger_savepoint(self, timeout: float = 600.0) -> str:
        """Take an aligned savepoint now and return its path (blocks until it completed)."""
        return self._exclusive(self._options(True), timeout)

    def stop_with_savepoint(self, savepoint: bool = True, drain: bool = False, timeout: float = 600.0) -> str:
        """Take the job's last checkpoint (Flink's stop-with-savepoint) and return its path.

        No checkpoint is triggered after it. Sources read nothing after its barrier (with ``drain``, they end
        their input first, so event time reaches its end and timers fire); once it completes, sinks commit
        it and every task finishes. If it fails, the job goes on running (unless it drained: its input
        ended, so the next checkpoint is again a terminal one) and the error is raised.

        Args:
            savepoint: A self-contained savepoint (``savepoint-<n>``, never deleted by retention); else a
                regular checkpoint (``chk-<n>``).
            drain: End the sources' input first (flush event time), as Flink's ``--drain``.
            timeout: Seconds to wait for a free slot and for the checkpoint to complete.
        """
        kind = CheckpointKind.SAVEPOINT if savepoint else CheckpointKind.CHECKPOINT
        opts = CheckpointOptions(kind, AlignmentMode.ALIGNED, terminate=True, drain=drain)
        with self.lock:
            self._terminal = opts  # no periodic checkpoint from now on
        try:
            self.terminal_path = self._exclusive(opts, timeout)
            return self.terminal_path
        except BaseException:
            if not drain:
                with self.lock:
                    self._terminal = None
            raise

    def _exclusive(self, opts: CheckpointOptions, timeout: float) -> str:
        """Trigger a checkpoint with ``opts`` once none is pending; wait for it; return its path."""
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                if opts.terminate and self.terminal_path is not None:
                    # an end-of-input request took the terminal checkpoint (these options) while we waited
                    return self.terminal_path
                if self._stopped.is_set() or all(t in self.finished for t in self.tasks):
                    raise CheckpointError(CheckpointFailureReason.FINISHED, "the job is not running")
                if not self.pending:
                    cid = self._trigger(opts)
                    p = self.pending[cid]
                    break
            if time.monotonic() > deadline:
                raise CheckpointError(CheckpointFailureReason.EXPIRED, "no slot for a savepoint")
            time.sleep(0.01)
        if not p.done.wait(max(0.0, deadline - time.monotonic())) and opts.terminate:
            with self.lock:  # a stop that was given up must not end the job later
                self._abort(cid, CheckpointFailureReason.EXPIRED, f"not completed within {timeout}s")
        if p.error is not None:
            raise p.error
        if not p.done.is_set():
            raise CheckpointError(CheckpointFailureReason.EXPIRED, checkpoint_id=cid)
        return self.storage.checkpoint_dir(cid, savepoint=opts.kind is CheckpointKind.SAVEPOINT)

    def _trigger(self, opts: CheckpointOptions) -> int:
        cid = self.next_id
        self.next_id += 1
        barrier = CheckpointBarrier(cid, time.time(), opts)
        waiting = {t for t in self.tasks if t not in self.finished}
        p = PendingCheckpoint(cid, barrier, waiting)
        for t, handle in self.finished.items():
            p.acks[t] = handle
        for name, enum in self.enumerators.items():
            p.enumerators[name] = self.codec.enumerator_state(name, enum.snapshot_state(cid))
        self.pending[cid] = p
        self.stats.triggered(cid, barrier.timestamp, opts.kind.value, opts.alignment.value)
        for t in sorted(waiting, key=lambda s: (s.vertex, s.index)):
            if t in self.source_tasks or t in self.ended:
                self.tasks[t].trigger_checkpoint(barrier)
        return cid

    # -- messages from tasks -------------------------------------------------------------------------
    def acknowledge(self, task: SubtaskId, checkpoint_id: int, handle: dict[str, Any]) -> AckResult:
        with self.lock:
            p = self.pending.get(checkpoint_id)
            if p is None:
                if checkpoint_id in self._aborted:  # written after the abort deleted the folder
                    self.store.discard(checkpoint_id, self._aborted[checkpoint_id])
                    self.store.discard_uploads(refs_of([handle]))
                return AckResult.UNKNOWN if checkpoint_id >= self.next_id else AckResult.DISCARDED
            result = p.acknowledge(task, handle)
            if result is AckResult.DUPLICATE and task in self.finished:
                # a finished task's upload ended after it finished: its final state stands in for it
                self.store.discard_uploads(refs_of([handle]))
            if result is AckResult.SUCCESS:
                self.last_handles[task] = handle
                if p.fully_acknowledged:
                    self._complete(p)
            return result

    def decline(
        self,
        task: SubtaskId,
        checkpoint_id: int,
        reason: str,
        failure: CheckpointFailureReason = CheckpointFailureReason.DECLINED,
    ) -> None:
        with self.lock:
            if task in self.finished:
                return  # it acknowledged with its final state; an upload cut short by its end does not count
            if checkpoint_id in self.pending:
                self._abort(checkpoint_id, failure, reason)
            elif checkpoint_id in self._aborted:  # a late writer may have left a file
                self.store.discard(checkpoint_id, self._aborted[checkpoint_id])

    def end_of_input(self, task: SubtaskId) -> None:
        """``task``'s inputs all ended: trigger it directly from now on, also for pending checkpoints."""
        with self.lock:
            self.ended.add(task)
            for p in self.pending.values():
                if task in p.waiting:
                    self.tasks[task].trigger_checkpoint(p.barrier)
            pending_any = bool(self.pending)
        if not pending_any:
            self.request_checkpoint()

    def task_finished(self, task: SubtaskId) -> None:
        """``task`` finished after its final checkpoint: later checkpoints reuse its last state handle."""
        with self.lock:
            handle = self.completed_handles.get(task) or self.last_handles.get(task) or {}
            # keep its bytes: every later checkpoint gets its own copy, so retention never breaks a restore
            path = handle.get("path")
            keep = FinishedKeyedState(self.storage, path, handle.get("shared") or []) if path else None
            data = (
                self.storage.retrying("read", self.codec.without_channel_state, self.storage, path, keep)
                if path
                else None
            )
            final = {**handle, "committables": [], "finished": True, "data": data, "stats": {}}
            final["shared"] = keep.ack_shared() if keep is not None else []
            self.finished[task] = final
            # its state no longer changes: it acknowledges pending checkpoints with its final state
            for p in sorted(self.pending.values(), key=lambda p: p.checkpoint_id):
                if p.acknowledge(task, final) is AckResult.SUCCESS and p.fully_acknowledged:
                    self._complete(p)

    # -- completion and abort ------------------------------------------------------------------------
    def _complete(self, p: PendingCheckpoint) -> None:
        cid = p.checkpoint_id
        uncommitted = self.global_commits.uncommitted if self.global_commits is not None else lambda: {}
        shared = refs_of(p.acks.values())
        try:  # before the metadata: a checkpoint over a shared file that may be gone never completes
            self.store.shared.validate(cid, shared)
            done = p.finalize(self.storage, self.codec, self.job_info, self.committed_upto, uncommitted)
        except CheckpointError as exc:
            self._abort(cid, exc.reason, exc.detail)
            return
        except FinalizeError as exc:
            self._abort(cid, CheckpointFailureReason.STORAGE_FAILURE, str(exc))
            return
        # the checkpoint is complete (its metadata is written): what follows never undoes that
        del self.pending[cid]
        for t, h in done.acks.items():
            if not h.get("finished"):
                self.completed_handles[t] = h
        self.store.add(cid, done.directory, done.savepoint, shared)
        stats = self.stats.completed(cid, done.duration, done.directory, done.acks)
        self.failures.completed()
        self.last_completed_at = time.monotonic()
        if p.barrier.options.terminate:
            self.terminal_path = done.directory  # the job's last checkpoint: nothing is triggered after it
        # older pending checkpoints are subsumed
        for older in [c for c in self.pending if c < cid]:
            self._abort(older, CheckpointFailureReason.SUBSUMED, f"checkpoint {cid} completed")
        self._announce(done)
        p.done.set()
        self._wake.set()
        log.info("checkpoint %d completed in %.3fs (%d bytes)", cid, done.duration, stats.state_bytes)

    def _announce(self, done: CompletedCheckpoint) -> None:
        """Hand a completed checkpoint's committables to the commit queue and tell the running tasks."""
        cid = done.checkpoint_id
        self.committed_upto = cid  # handed to the commit queue: acknowledgements need not carry them again
        if self.global_commits is not None:
            self.global_commits.submit(cid, done.committables)
        for t, handle in self.tasks.items():
            if t not in self.finished:
                handle.notify_checkpoint_complete(cid)
        if self.terminal_path is None and any(t not in self.finished for t in self.ended):
            self.request_checkpoint()  # tasks that ended input may still need a checkpoint taken after that

    def _abort(self, cid: int, reason: CheckpointFailureReason, detail: str, notify: bool = True) -> None:
        p = self.pending.pop(cid, None)
        if p is None:
            return
        savepoint = p.savepoint
        self._aborted[cid] = savepoint
        if len(self._aborted) > _ABORTED_KEPT:  # late writers come within the timeout, not a thousand later
            del self._aborted[next(iter(self._aborted))]
        p.abort(CheckpointError(reason, detail, cid))
        self._wake.set()
        self.stats.failed(cid, reason.name, detail or reason.message, time.monotonic() - p.started)
        if notify:
            for t, handle in self.tasks.items():
                if t not in self.finished:
                    try:
                        handle.notify_checkpoint_aborted(cid)
                    except Exception as exc:
                        self.on_cleanup_failure(f"telling {t} that checkpoint {cid} was aborted", exc)
        self.store.discard(cid, savepoint)
        self.store.discard_uploads(refs_of(h for t, h in p.acks.items() if t not in self.finished))
        self.failures.failed(cid, reason, detail, counts=not savepoint and not p.barrier.options.terminate)

    def _expire(self, now: float) -> None:
        with self.lock:
            for cid, p in list(self.pending.items()):
                if now - p.started > self.config.timeout:
                    missing = ", ".join(sorted(str(t) for t in p.waiting))
                    self._abort(cid, CheckpointFailureReason.EXPIRED, f"no acknowledgement from {missing}")

