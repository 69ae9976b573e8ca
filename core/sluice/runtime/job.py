"""The runtime-independent part of running a job: attempts, restore, the control plane, task assembly.

``run_job`` applies the restart strategy (tenacity) around attempts. An attempt loads the checkpoint to
restore (the user's, or the latest completed one after a failure), lets sinks clean up what later,
unfinished checkpoints left behind, re-commits the restored committables, starts the coordinator and the
source enumerators, and hosts the :class:`JobAttempt` control plane that tasks report to. The runtime
(in-process or Spark) only supplies channels, threads or processes.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sluice.checkpoint.coordinator import CheckpointCoordinator, TaskHandle
from sluice.checkpoint.stats import CheckpointStats
from sluice.checkpoint.storage import CheckpointStorage, checkpoint_storage
from sluice.config import CheckpointConfig, FixedDelayRestart, RestartStrategy
from sluice.errors import CheckpointFailureReason, ConfigError, JobFailedError, RestoreError
from sluice.events import AlignmentMode
from sluice.graph import JobEdge, JobGraph, JobVertex, NodeKind, Partitioning, SubtaskId
from sluice.runtime.channels import InputChannel, OutputChannel, Signal
from sluice.runtime.faults import FaultInjector
from sluice.runtime.operators import OperatorContext
from sluice.runtime.partitioners import (
    BroadcastPartitioner,
    ForwardPartitioner,
    HashPartitioner,
    Partitioner,
    RebalancePartitioner,
)
from sluice.runtime.restore import RestoredCheckpoint
from sluice.runtime.sink_operator import commit_with_retry
from sluice.runtime.task import ChainOutput, RecordWriter, Task, TaskGateway
from sluice.sink import Sink
from sluice.source import Source, SourceSplit
from sluice.state.keygroups import key_group_range

__all__ = ["JobAttempt", "JobConfig", "JobResult", "build_task", "make_partitioner", "run_job"]

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


class AttemptFailedError(Exception):
    """An attempt failed; ``__cause__`` is the root cause. Triggers a restart."""


def make_partitioner(edge: JobEdge, max_parallelism: int, sender_index: int) -> Partitioner:
    """The partitioner subtask ``sender_index`` uses on ``edge``."""
    p = edge.partitioning
    if p is Partitioning.FORWARD:
        return ForwardPartitioner()
    if p is Partitioning.BROADCAST:
        return BroadcastPartitioner()
    if p is Partitioning.HASH:
        assert edge.key is not None
        return HashPartitioner(edge.key, max_parallelism)
    return RebalancePartitioner(start=sender_index)


def build_task(
    job: JobGraph,
    vertex: JobVertex,
    index: int,
    inputs: list[InputChannel],
    input_edges: list[int],
    outputs: dict[int, list[OutputChannel]],
    signal: Signal,
    gateway: TaskGateway,
    storage: CheckpointStorage,
    cfg: JobConfig,
    attempt: int,
    restored: RestoredCheckpoint | None,
    faults: FaultInjector | None,
) -> Task:
    """Assemble subtask ``index`` of ``vertex``: operators, chain outputs, writers, reader, restore."""
    kgr = key_group_range(job.max_parallelism, vertex.parallelism, index)
    ops = [node.factory() for node in vertex.chain]
    ctxs = [
        OperatorContext(node.name, index, vertex.parallelism, job.max_parallelism, kgr, cfg.job_id, attempt)
        for node in vertex.chain
    ]
    writers: dict[tuple[int, str | None], list[RecordWriter]] = {}
    for e_idx, e in enumerate(vertex.outputs):
        w = RecordWriter(make_partitioner(e, job.max_parallelism, index), outputs[e_idx])
        writers.setdefault(e.producer, []).append(w)
    for pos, (node, op, ctx) in enumerate(zip(vertex.chain, ops, ctxs, strict=True)):
        nxt = ops[pos + 1] if pos + 1 < len(ops) else None
        side = {tag: ws for (nid, tag), ws in writers.items() if nid == node.id and tag is not None}
        main = writers.get((node.id, None), []) if nxt is None else []
        op.setup(ctx, ChainOutput(nxt, main, side))
    reader = None
    head = vertex.chain[0]
    if head.kind is NodeKind.SOURCE:
        reader = head.spec.create_reader(
            _ReaderCtx(SubtaskId(vertex.id, index), vertex.parallelism, cfg.job_id, ctxs[0], gateway)
        )
    unaligned_ok = all(
        e.partitioning not in (Partitioning.FORWARD, Partitioning.BROADCAST) for e in vertex.inputs
    )
    restore = restored.for_subtask(job, vertex, index) if restored is not None else None
    task = Task(
        SubtaskId(vertex.id, index),
        vertex.name,
        ops,
        ctxs,
        inputs,
        input_edges,
        unaligned_ok,
        writers,
        signal,
        gateway,
        storage,
        cfg.alignment(),
        reader=reader,
        restore=restore,
        faults=faults,
        max_batch_rows=cfg.max_batch_rows,
    )
    return task


class _ReaderCtx:
    """ReaderContext of a source subtask."""

    def __init__(
        self, task_id: SubtaskId, parallelism: int, job_id: str, op_ctx: OperatorContext, gw: TaskGateway
    ) -> None:
        self.task_id = task_id
        self._parallelism = parallelism
        self._job_id = job_id
        self._op_ctx = op_ctx
        self._gw = gw

    @property
    def subtask(self) -> int:
        return self.task_id.index

    @property
    def parallelism(self) -> int:
        return self._parallelism

    @property
    def job_id(self) -> str:
        return self._job_id

    def request_split(self) -> None:
        self._gw.request_split(self.task_id)

    def metric(self, name: str, increment: int = 1) -> None:
        self._op_ctx.metric(name, increment)


class _EnumeratorCtx:
    """EnumeratorContext: routes assignments to the source subtasks of one vertex."""

    def __init__(self, attempt: JobAttempt, vertex: JobVertex) -> None:
        self._a = attempt
        self._v = vertex
        self.registered: list[int] = []

    @property
    def parallelism(self) -> int:
        return self._v.parallelism

    def assign_splits(self, assignment: dict[int, list[SourceSplit]]) -> None:
        for i, splits in assignment.items():
            if splits:
                self._a.remote(SubtaskId(self._v.id, i)).assign_splits(splits)

    def signal_no_more_splits(self, subtask: int) -> None:
        self._a.remote(SubtaskId(self._v.id, subtask)).no_more_splits()

    def registered_readers(self) -> list[int]:
        return list(self.registered)


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
        self.failure: BaseException | None = None
        self.failed_task: SubtaskId | None = None
        self.finished_tasks: set[SubtaskId] = set()
        self.done = threading.Event()
        self.enumerators: dict[str, Any] = {}
        self._enum_ctx: dict[int, _EnumeratorCtx] = {}
        self.coordinator: CheckpointCoordinator | None = None
        self.metrics: dict[str, int] = {}
        self._poll_thread: threading.Thread | None = None

    # -- setup -----------------------------------------------------------------------------------------
    def recover_sinks(self) -> None:
        """Before tasks start: sinks abort leftovers of unfinished checkpoints; global commits are redone."""
        r = self.restored
        for node in self.job.logical.nodes.values():
            if node.kind is not NodeKind.SINK:
                continue
            sink: Sink[Any] = node.spec
            comms = r.sink_committables(node.name) if r is not None else []
            sink.recover(self.cfg.job_id, comms)
            gc = sink.create_global_committer()
            if gc is not None and r is not None:
                restored_global = r.global_committables().get(node.name, [])
                commit_with_retry(node.name, gc.commit, r.checkpoint_id, restored_global)

    def remote(self, task: SubtaskId) -> Any:
        return self.tasks[task]

    def register(self, task: SubtaskId, handle: Any) -> None:
        self.tasks[task] = handle

    def start_control(self) -> None:
        """Create enumerators and the coordinator; register readers. Call after tasks are registered."""
        r = self.restored
        source_tasks: set[SubtaskId] = set()
        for v in self.job.vertices.values():
            if not v.is_source:
                continue
            node = v.chain[0]
            src: Source = node.spec
            ctx = _EnumeratorCtx(self, v)
            self._enum_ctx[v.id] = ctx
            enum = src.create_enumerator(ctx, r.enumerator_state(node.name) if r else None)
            self.enumerators[node.name] = enum
            source_tasks.update(SubtaskId(v.id, i) for i in range(v.parallelism))
        globals_: dict[str, Callable[[int, list[Any]], None]] = {}
        for node in self.job.logical.nodes.values():
            if node.kind is NodeKind.SINK:
                gc = node.spec.create_global_committer()
                if gc is not None:
                    globals_[node.name] = functools.partial(commit_with_retry, node.name, gc.commit)
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
        }
        next_id = (r.checkpoint_id + 1) if r is not None else 1
        prior = self._latest_id()
        next_id = max(next_id, prior + 1)
        completed = [(r.checkpoint_id, r.path)] if r is not None and "savepoint-" not in r.path else []
        self.coordinator = CheckpointCoordinator(
            self.cfg.checkpoint,
            self.storage,
            self.tasks,
            source_tasks,
            job_info,
            next_id,
            enumerators=self.enumerators,
            enumerator_lock=self.lock,
            global_committers=globals_,
            on_fatal=lambda exc: self.failed(None, exc),
            completed=completed,
        )
        with self.lock:
            for v in self.job.vertices.values():
                if not v.is_source:
                    continue
                enum = self.enumerators[v.chain[0].name]
                enum.start()
                if r is not None:
                    splits = r.reader_splits(v.chain[0].name)
                    if splits:
                        enum.add_splits_back(splits)
                for i in range(v.parallelism):
                    self._enum_ctx[v.id].registered.append(i)
                    enum.add_reader(i)
        self.coordinator.start()
        self._poll_thread = threading.Thread(target=self._poll_enumerators, name="enumerators", daemon=True)
        self._poll_thread.start()

    def _latest_id(self) -> int:
        ids = [cid for cid, _, _ in self.storage.completed()]
        stats = self.storage.read_stats()
        ids += [int(s["checkpoint_id"]) for s in stats]
        return max(ids, default=0)

    def _poll_enumerators(self) -> None:
        last: dict[str, float] = {}
        while not self.done.is_set():
            for v in self.job.vertices.values():
                if not v.is_source:
                    continue
                node = v.chain[0]
                interval = node.spec.discovery_interval
                if interval is None:
                    continue
                now = time.monotonic()
                if now - last.get(node.name, now - interval - 1) >= interval:
                    last[node.name] = now
                    try:
                        with self.lock:
                            self.enumerators[node.name].poll()
                    except Exception as exc:
                        self.failed(None, exc)
            self.done.wait(0.05)

    # -- TaskGateway -----------------------------------------------------------------------------------
    def acknowledge(self, task: SubtaskId, checkpoint_id: int, handle: dict[str, Any]) -> None:
        if self.coordinator is not None:
            self.coordinator.acknowledge(task, checkpoint_id, handle)

    def decline(self, task: SubtaskId, checkpoint_id: int, reason: str) -> None:
        if self.coordinator is not None:
            self.coordinator.decline(task, checkpoint_id, reason)

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

    def failed(self, task: SubtaskId | None, error: BaseException) -> None:
        with self.lock:
            if self.failure is None:
                self.failure = error
                self.failed_task = task
                log.warning("attempt %d: %s failed: %s", self.attempt, task or "job", error)
        self.done.set()

    def request_split(self, task: SubtaskId) -> None:
        with self.lock:
            v = self.job.vertices[task.vertex]
            self.enumerators[v.chain[0].name].handle_split_request(task.index)

    # -- teardown --------------------------------------------------------------------------------------
    def stop(self) -> None:
        self.done.set()
        if self.coordinator is not None:
            ok = self.failure is None and len(self.finished_tasks) == len(self.tasks)
            reason = CheckpointFailureReason.FINISHED if ok else CheckpointFailureReason.JOB_FAILOVER
            if isinstance(self.failure, _Cancel):
                reason = CheckpointFailureReason.JOB_CANCELLED
            self.coordinator.stop(reason)
        for e in self.enumerators.values():
            try:
                e.close()
            except Exception:
                log.exception("closing enumerator")


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
    run_attempt: Callable[[JobAttempt, FaultInjector | None], None],
    faults: FaultInjector | None = None,
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
            restored.check_compatible(job)
        a = JobAttempt(job, cfg, storage, n, restored)
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
        if a.failure is not None and not isinstance(a.failure, _Cancel):
            state["failures"].append(f"attempt {n}: {type(a.failure).__name__}: {a.failure}")
            if isinstance(a.failure, (RestoreError, ConfigError)):
                raise a.failure  # a restart cannot fix these
            raise AttemptFailedError(str(a.failure)) from a.failure

    try:
        for attempt in cfg.restart.retrying(AttemptFailedError):
            with attempt:
                one_attempt()
    except AttemptFailedError as exc:
        cause = exc.__cause__ or exc
        raise JobFailedError(
            f"job {cfg.job_id!r} failed after {state['attempt']} attempt(s); root cause: {cause}"
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


class _Cancel(Exception):
    """The job was cancelled by its client."""


__all__ += ["AttemptFailedError", "TaskHandle"]
