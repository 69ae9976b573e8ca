"""The checkpoint coordinator: triggers checkpoints, collects acknowledgements, completes or aborts them.

Runs in the driver. A checkpoint n goes: trigger (enumerator snapshots, barriers injected at the source
tasks and at tasks whose inputs all ended) -> every running task acknowledges with a state handle ->
metadata written **last** and atomically -> its global committables go to the ordered commit queue
(:mod:`sluice.checkpoint.global_commit`) -> tasks are notified ``checkpoint_complete(n)`` -> subsumed
checkpoints beyond ``num_retained`` are deleted. A checkpoint that
expires or is declined is aborted: tasks get ``checkpoint_aborted(n)``, its files are deleted and the
failure with its reason goes into the stats history.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from sluice.checkpoint.codec import MetadataCodec
from sluice.checkpoint.global_commit import CommitGroups, GlobalCommitQueue
from sluice.checkpoint.stats import CheckpointStats, CheckpointStatus
from sluice.checkpoint.storage import CheckpointStorage
from sluice.config import CheckpointConfig
from sluice.errors import CheckpointError, CheckpointFailureReason
from sluice.events import AlignmentMode, CheckpointBarrier, CheckpointKind, CheckpointOptions
from sluice.graph import SubtaskId

__all__ = ["AckResult", "CheckpointCoordinator", "TaskHandle"]

log = logging.getLogger("sluice.checkpoint")


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


@dataclass
class _Pending:
    checkpoint_id: int
    barrier: CheckpointBarrier
    waiting: set[SubtaskId]
    acks: dict[SubtaskId, dict[str, Any]] = field(default_factory=dict)
    enumerators: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)
    error: CheckpointError | None = None


class CheckpointCoordinator:
    """Drives checkpoints of one job attempt."""

    def __init__(
        self,
        config: CheckpointConfig,
        storage: CheckpointStorage,
        tasks: dict[SubtaskId, TaskHandle],
        source_tasks: set[SubtaskId],
        job_info: dict[str, Any],
        next_checkpoint_id: int,
        enumerators: dict[str, Any] | None = None,
        enumerator_lock: threading.RLock | None = None,
        global_commits: GlobalCommitQueue | None = None,
        on_fatal: Callable[[BaseException], None] | None = None,
        completed: list[tuple[int, str]] | None = None,
        committed_upto: int = 0,
        codec: MetadataCodec | None = None,
    ) -> None:
        self.config = config
        self.storage = storage
        self.tasks = tasks
        self.source_tasks = source_tasks
        self.job_info = job_info
        self.next_id = next_checkpoint_id
        self.enumerators = enumerators or {}
        self.lock = enumerator_lock or threading.RLock()
        self.global_commits = global_commits
        self.on_fatal = on_fatal or (lambda exc: None)
        self.codec = codec or MetadataCodec(config.resolved_key())
        self.pending: dict[int, _Pending] = {}
        self.ended: set[SubtaskId] = set()
        self.finished: dict[SubtaskId, dict[str, Any]] = {}
        self.last_handles: dict[SubtaskId, dict[str, Any]] = {}
        self.completed_handles: dict[SubtaskId, dict[str, Any]] = {}
        self.completed: list[tuple[int, str]] = list(completed or [])
        self.history: list[CheckpointStats] = []
        #: the last checkpoint whose committables went to the global committers (restored one after a restore)
        self.committed_upto = committed_upto
        self.consecutive_failures = 0
        self.last_completed_at = 0.0
        self._stopped = threading.Event()
        #: while set, only the terminal checkpoint of stop-with-savepoint is triggered (with these options)
        self._terminal: CheckpointOptions | None = None
        #: the path of the terminal checkpoint once it completed
        self.terminal_path: str | None = None
        self._thread: threading.Thread | None = None
        self._wanted = threading.Event()  # a trigger was requested (end of input)
        self._wake = threading.Event()  # wakes the trigger loop: a request, or a pending checkpoint ended

    # -- lifecycle -----------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="checkpoint-coordinator", daemon=True)
        self._thread.start()

    def stop(self, reason: CheckpointFailureReason = CheckpointFailureReason.JOB_FAILOVER) -> None:
        """Stop triggering; pending checkpoints are aborted with ``reason``."""
        self._stopped.set()
        self._wake.set()
        with self.lock:
            for cid in list(self.pending):
                self._abort(cid, reason, "", notify=False)
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
        p = _Pending(cid, barrier, waiting)
        for t, handle in self.finished.items():
            p.acks[t] = handle
        for name, enum in self.enumerators.items():
            p.enumerators[name] = self.codec.enumerator_state(name, enum.snapshot_state(cid))
        self.pending[cid] = p
        self.history.append(
            CheckpointStats(
                cid,
                CheckpointStatus.IN_PROGRESS,
                barrier.timestamp,
                kind=opts.kind.value,
                alignment=opts.alignment.value,
            )
        )
        for t in sorted(waiting, key=lambda s: (s.vertex, s.index)):
            if t in self.source_tasks or t in self.ended:
                self.tasks[t].trigger_checkpoint(barrier)
        return cid

    # -- messages from tasks -------------------------------------------------------------------------
    def acknowledge(self, task: SubtaskId, checkpoint_id: int, handle: dict[str, Any]) -> AckResult:
        with self.lock:
            p = self.pending.get(checkpoint_id)
            if p is None:
                return AckResult.UNKNOWN if checkpoint_id >= self.next_id else AckResult.DISCARDED
            if task not in p.waiting:
                return AckResult.DUPLICATE
            p.waiting.discard(task)
            p.acks[task] = handle
            self.last_handles[task] = handle
            if not p.waiting:
                self._complete(p)
            return AckResult.SUCCESS

    def decline(self, task: SubtaskId, checkpoint_id: int, reason: str) -> None:
        with self.lock:
            if checkpoint_id in self.pending:
                self._abort(checkpoint_id, CheckpointFailureReason.DECLINED, reason)

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
            data = self.codec.without_channel_state(self.storage, handle["path"]) if handle.get("path") else None
            final = {**handle, "committables": [], "finished": True, "data": data, "stats": {}}
            self.finished[task] = final
            # its state no longer changes: it acknowledges pending checkpoints with its final state
            for p in sorted(self.pending.values(), key=lambda p: p.checkpoint_id):
                if task in p.waiting:
                    p.waiting.discard(task)
                    p.acks[task] = final
                    if not p.waiting:
                        self._complete(p)

    # -- completion and abort ------------------------------------------------------------------------
    def _complete(self, p: _Pending) -> None:
        cid = p.checkpoint_id
        savepoint = p.barrier.options.kind is CheckpointKind.SAVEPOINT
        duration = time.monotonic() - p.started
        committables: dict[str, list[Any]] = {}
        try:
            for t, h in list(p.acks.items()):
                if h.get("data") is not None:
                    path = self.storage.write_task_state(
                        cid, f"{t.vertex}-{t.index}.state", h["data"], savepoint
                    )
                    p.acks[t] = {k: v for k, v in h.items() if k != "data"} | {"path": path}
        except Exception as exc:
            self._abort(cid, CheckpointFailureReason.STORAGE_FAILURE, str(exc))
            return
        for h in p.acks.values():
            for sink_name, c in h.get("committables") or []:
                # a failed checkpoint's committables come again with later acknowledgements until a
                # completed checkpoint took them: take each once
                if c.checkpoint_id > self.committed_upto:
                    committables.setdefault(sink_name, []).append(c.committable)
        metadata = {
            **self.job_info,
            "checkpoint_id": cid,
            "kind": p.barrier.options.kind.value,
            "alignment": p.barrier.options.alignment.value,
            "trigger_time": p.barrier.timestamp,
            "duration_s": duration,
            "tasks": {
                str(t): {k: v for k, v in h.items() if k != "committables"}
                for t, h in sorted(p.acks.items(), key=lambda kv: (kv[0].vertex, kv[0].index))
            },
            "enumerators": p.enumerators,
            "global_committables": self.codec.global_committables(self._groups(cid, committables)),
        }
        try:
            path = self.storage.write_metadata(cid, self.codec.seal(metadata), savepoint)
        except Exception as exc:
            self._abort(cid, CheckpointFailureReason.STORAGE_FAILURE, str(exc))
            return
        del self.pending[cid]
        for t, h in p.acks.items():
            if not h.get("finished"):
                self.completed_handles[t] = h
        stats = self._stats(cid)
        directory = path.rsplit("/", 1)[0]
        stats.completed(duration, directory, p.acks)
        self.storage.record_stats(stats.to_dict())
        self.consecutive_failures = 0
        self.last_completed_at = time.monotonic()
        if p.barrier.options.terminate:
            self.terminal_path = directory  # the job's last checkpoint: nothing is triggered after it
        # older pending checkpoints are subsumed
        for older in [c for c in self.pending if c < cid]:
            self._abort(older, CheckpointFailureReason.SUBSUMED, f"checkpoint {cid} completed")
        self.committed_upto = cid  # handed to the commit queue: acknowledgements need not carry them again
        if self.global_commits is not None:
            self.global_commits.submit(cid, committables)
        for t, handle in self.tasks.items():
            if t not in self.finished:
                handle.notify_checkpoint_complete(cid)
        if self.terminal_path is None and any(t not in self.finished for t in self.ended):
            self.request_checkpoint()  # tasks that ended input may still need a checkpoint taken after that
        if not savepoint:
            self.completed.append((cid, directory))
            while len(self.completed) > self.config.num_retained:
                old, _ = self.completed.pop(0)
                self.storage.discard(old)
        p.done.set()
        self._wake.set()
        log.info("checkpoint %d completed in %.3fs (%d bytes)", cid, duration, stats.state_bytes)

    def _groups(self, cid: int, committables: dict[str, list[Any]]) -> dict[str, CommitGroups]:
        """What checkpoint ``cid``'s metadata records for global committers: the committables of earlier
        checkpoints whose commit has not returned yet, then its own, by checkpoint (a restore commits them
        in this order)."""
        groups = self.global_commits.uncommitted() if self.global_commits is not None else {}
        for uid, comms in committables.items():
            if comms:
                groups.setdefault(uid, []).append((cid, comms))
        return groups

    def _stats(self, cid: int) -> CheckpointStats:
        for s in reversed(self.history):
            if s.checkpoint_id == cid:
                return s
        s = CheckpointStats(cid, CheckpointStatus.IN_PROGRESS, time.time())
        self.history.append(s)
        return s

    def _abort(self, cid: int, reason: CheckpointFailureReason, detail: str, notify: bool = True) -> None:
        p = self.pending.pop(cid, None)
        if p is None:
            return
        savepoint = p.barrier.options.kind is CheckpointKind.SAVEPOINT
        p.error = CheckpointError(reason, detail, cid)
        p.done.set()
        self._wake.set()
        stats = self._stats(cid)
        stats.finish(CheckpointStatus.FAILED)
        stats.failure_reason = reason.name
        stats.failure_detail = detail or reason.message
        stats.duration_s = time.monotonic() - p.started
        try:
            self.storage.record_stats(stats.to_dict())
        except Exception:
            log.exception("recording stats of checkpoint %d failed", cid)
        if notify:
            for t, handle in self.tasks.items():
                if t not in self.finished:
                    handle.notify_checkpoint_aborted(cid)
        self.storage.discard(cid, savepoint)
        quiet = (CheckpointFailureReason.FINISHED, CheckpointFailureReason.SUBSUMED, CheckpointFailureReason.JOB_CANCELLED)
        if reason not in quiet:
            log.warning("checkpoint %d failed: %s %s", cid, reason.message, detail)
        # a failed savepoint or stop is the caller's error to handle; it never fails the job (as in Flink)
        if reason.counts_toward_tolerable and not savepoint and not p.barrier.options.terminate:
            self.consecutive_failures += 1
            if self.consecutive_failures > self.config.tolerable_failed_checkpoints:
                self.on_fatal(
                    CheckpointError(
                        reason,
                        f"{detail} ({self.consecutive_failures} consecutive failed checkpoints, "
                        f"tolerable_failed_checkpoints={self.config.tolerable_failed_checkpoints})",
                        cid,
                    )
                )

    def _expire(self, now: float) -> None:
        with self.lock:
            for cid, p in list(self.pending.items()):
                if now - p.started > self.config.timeout:
                    missing = ", ".join(sorted(str(t) for t in p.waiting))
                    self._abort(cid, CheckpointFailureReason.EXPIRED, f"no acknowledgement from {missing}")
