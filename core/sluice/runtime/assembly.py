"""Task assembly: one subtask of a vertex from the job graph (operators, chain outputs, writers, reader).

Both runtimes call :func:`build_task` once per subtask they host; only the channels differ.
"""

from __future__ import annotations

import time

from sluice.checkpoint.state_files import CheckpointFileTransfer
from sluice.checkpoint.storage import CheckpointStorage
from sluice.config.job import JobConfig
from sluice.events import AlignmentMode
from sluice.graph import JobEdge, JobGraph, JobVertex, NodeKind, Partitioning, SubtaskId
from sluice.operators.base import OperatorContext
from sluice.runtime.channels import InputChannel, OutputChannel, Signal
from sluice.runtime.fault_hook import FaultHook
from sluice.runtime.output import ChainOutput, RecordWriter
from sluice.runtime.partitioners import (
    BroadcastPartitioner,
    ForwardPartitioner,
    HashPartitioner,
    Partitioner,
    RebalancePartitioner,
)
from sluice.runtime.restore import RestoredCheckpoint
from sluice.runtime.task import Task, TaskGateway
from sluice.runtime.task_spec import TaskSpec
from sluice.state.factory import state_backend_for
from sluice.state.keygroups import key_group_range

__all__ = ["build_task", "make_partitioner"]


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
    faults: FaultHook,
) -> Task:
    """Assemble subtask ``index`` of ``vertex`` (operators, chain outputs, writers, reader, restore) into a
    :class:`~sluice.runtime.task_spec.TaskSpec`, and the :class:`Task` that runs it."""
    kgr = key_group_range(job.max_parallelism, vertex.parallelism, index)
    ops = [node.factory() for node in vertex.chain]
    backend = state_backend_for(cfg.state_backend)  # one per process: its memory is shared
    files = CheckpointFileTransfer(storage)
    ctxs = [
        OperatorContext(
            node.name,
            index,
            vertex.parallelism,
            job.max_parallelism,
            kgr,
            cfg.job_id,
            attempt,
            state_backend=backend,
            state_files=files,
        )
        for node in vertex.chain
    ]
    writers: dict[tuple[int, str | None], list[RecordWriter]] = {}
    for e_idx, e in enumerate(vertex.outputs):
        partitioner = make_partitioner(e, job.max_parallelism, index)
        w = RecordWriter(partitioner, outputs[e_idx], e.unaligned_ok, counted=cfg.metrics)
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
    alignment = cfg.alignment()
    if alignment in (AlignmentMode.UNALIGNED, AlignmentMode.ADAPTIVE) and not all(
        e.unaligned_ok for e in vertex.inputs
    ):
        alignment = (
            AlignmentMode.ALIGNED
        )  # a forward/broadcast/sink-internal input aligns (ARCHITECTURE.md 4)
    spec = TaskSpec(
        SubtaskId(vertex.id, index),
        vertex.name,
        ops,
        ctxs,
        inputs,
        input_edges,
        writers,
        signal,
        alignment,
        reader=reader,
        restore=restored.for_subtask(job, vertex, index) if restored is not None else None,
        max_batch_rows=cfg.max_batch_rows,
        stop_timeout=cfg.task_cancellation_timeout,
        metrics=cfg.metrics,
        checkpoint_key=cfg.checkpoint.resolved_key(),
        split_serializer=head.spec.split_serializer() if head.kind is NodeKind.SOURCE else None,
    )
    return Task(spec, gateway, storage, faults)


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

    def gauge(self, name: str, value: float) -> None:
        self._op_ctx.gauge(name, value)

    def stalled(self, reason: str | None) -> None:
        stall = self._op_ctx.stall  # kept with the time the stall began
        self._op_ctx.stall = None if reason is None else (stall[0] if stall else time.time(), reason)
