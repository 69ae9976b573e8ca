"""The operators that run a two-phase-commit sink: its writer and its committer (chained in one task), or
for a sink that compacts, a writer stage and a compactor/committer stage keyed by the compactor's key
(:func:`add_sink` expands ``Stream.sink`` into them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import pyarrow as pa

from sluice.errors import ConfigError
from sluice.graph import LogicalEdge, LogicalGraph, LogicalNode, NodeKind, Partitioning
from sluice.keys import KeySelector
from sluice.operators.base import Collector, Operator, OperatorContext, OperatorSnapshot
from sluice.operators.committables import (
    commit_with_retry,
    decode_committables,
    encode_committables,
    pack_pending,
    pack_writer_state,
    unpack_pending,
    unpack_writer_state,
)
from sluice.sink import CommittableWithLineage, Committer, Compactor, Sink, SinkWriter
from sluice.state.spi import KeyedStateBackend

__all__ = ["SINK_RECORDS", "NodeAdder", "SinkOperator", "SinkWriterOperator", "add_sink"]

#: the counter of rows handed to sink writers (the records a job writes)
SINK_RECORDS = "sink_records"


class SinkOperator(Operator):
    """The committing side of a sink: commits committables of checkpoint n once n completes.

    Without compaction it also runs the sink's writer (writer and committer chained in one task). With
    compaction (``collect=True``) it is the compactor/committer stage: :class:`SinkWriterOperator` subtasks
    send it their committables keyed by :meth:`Compactor.key`; at the barrier it takes what arrived, and in
    the asynchronous part of the checkpoint merges each key's committables with the sink's compactor.

    State: the writer's state plus the committables not yet committed, by checkpoint id, written with the
    sink's writer-state and committable serializers (:func:`pack_writer_state`, :func:`pack_pending`). After a restore
    they are committed again (the committer is idempotent). Committables of a checkpoint that fails stay
    pending and go with the next checkpoint (per-subtask commit: committed when it completes; global commit:
    shipped again with its acknowledgement, tagged with their checkpoint, until a completion covers them).
    """

    operator_state_distribution = "round_robin"

    def __init__(self, name: str, sink: Sink[Any], collect: bool = False) -> None:
        super().__init__(name)
        self.sink = sink
        self.collect = collect
        self.writer: SinkWriter[Any] | None = None
        self.committer: Committer[Any] | None = None
        self.compactor: Compactor[Any] | None = None
        self.global_commit = sink.global_commit
        self._pending: dict[int, list[Any]] = {}
        self._incoming: list[Any] = []
        self._restored: list[Any] = []
        #: the writer's keyed state (:attr:`Sink.keyed_writer`), made in ``setup``
        self.backend: KeyedStateBackend | None = None

    def setup(self, ctx: OperatorContext, output: Collector) -> None:
        super().setup(ctx, output)
        if self.sink.keyed_writer and not self.collect:
            self.backend = ctx.create_keyed_backend(self.name)

    def initialize_state(self, keyed: list[dict[str, Any]], operator_states: list[Any]) -> None:
        if keyed and self.backend is not None:
            self.backend.restore(keyed)
        writer_states = []
        for st in operator_states:
            if not st:
                continue
            writer_states.append(unpack_writer_state(self.sink, st.get("writer"), self.name))
            for cid, comms in unpack_pending(self.sink, st.get("pending"), self.name):
                self._pending.setdefault(cid, []).extend(comms)
        self._restored = [w for w in writer_states if w is not None]

    def open(self) -> None:
        if self.collect:
            self.compactor = self.sink.create_compactor(_Ctx(self))
        else:
            self.writer = self.sink.create_writer(_Ctx(self), self._restored)
        self.committer = self.sink.create_committer(_Ctx(self))
        if self._pending:
            self._commit_upto(max(self._pending))

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if self.writer is not None:
            self.writer.write(batch)
            self.ctx.metric(SINK_RECORDS, batch.num_rows)
        else:
            self._incoming.extend(decode_committables(batch, self.sink.committable_serializer()))

    def prepare_snapshot_pre_barrier(self, checkpoint_id: int) -> None:
        if self.writer is not None:
            comms = self.writer.prepare_commit(checkpoint_id)
        else:
            comms, self._incoming = self._incoming, []
        if comms:
            self._pending[checkpoint_id] = list(comms)

    def snapshot_state(self, checkpoint_id: int, savepoint: bool = False) -> OperatorSnapshot:
        writer_state = self.writer.snapshot_state(checkpoint_id) if self.writer is not None else None
        snap = OperatorSnapshot(operator={"writer": pack_writer_state(self.sink, writer_state), "pending": []})
        if self.backend is not None:
            snap.keyed = self.backend.snapshot(checkpoint_id, savepoint)
        if self.global_commit:
            snap.committables = self._lineage(checkpoint_id)
        own = self._pending.get(checkpoint_id) if self.compactor is not None else None
        snap.async_part = lambda s: self._finish_async(checkpoint_id, list(own) if own else None, s)
        return snap

    def _lineage(self, checkpoint_id: int) -> list[CommittableWithLineage[Any]]:
        """Global commit: every pending committable up to ``checkpoint_id``, with its checkpoint."""
        pending = dict(self._pending)  # one C-level copy while the upload thread may replace an entry
        return [
            CommittableWithLineage(k, c) for k in sorted(pending) if k <= checkpoint_id for c in pending[k]
        ]

    def _finish_async(self, checkpoint_id: int, to_compact: list[Any] | None, snap: OperatorSnapshot) -> None:
        """Upload thread: compact this checkpoint's committables per key, then record the pending ones.

        The pending map is read here, not in the synchronous part: the single upload thread has finished the
        compaction of every earlier checkpoint by now, so their replaced committables are not recorded.
        """
        if to_compact is not None and self.compactor is not None:
            self.ctx.fault_hook("compaction")
            by_key: dict[str, list[Any]] = {}
            for c in to_compact:
                by_key.setdefault(self.compactor.key(c), []).append(c)
            compacted = [c for group in by_key.values() for c in self.compactor.compact(checkpoint_id, group)]
            self._pending[checkpoint_id] = compacted  # one assignment: atomic for the task thread
            if self.global_commit:
                snap.committables = self._lineage(checkpoint_id)
        if not self.global_commit:
            pending = dict(self._pending)  # one C-level copy while the task thread may add entries
            mine = [(k, list(v)) for k, v in sorted(pending.items()) if k <= checkpoint_id]
            snap.operator["pending"] = pack_pending(self.sink, mine)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        if self.backend is not None:
            self.backend.notify_checkpoint_complete(checkpoint_id)
        self.ctx.fault_hook("complete_to_commit")
        self._commit_upto(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        if self.backend is not None:
            self.backend.notify_checkpoint_aborted(checkpoint_id)

    def _commit_upto(self, checkpoint_id: int) -> None:
        ready = sorted(k for k in self._pending if k <= checkpoint_id)
        if not ready:
            return
        if self.committer is None:  # global commit: the coordinator committed them with ``checkpoint_id``
            for k in ready:
                del self._pending[k]
            return
        comms = [c for k in ready for c in self._pending[k]]
        commit_with_retry(self.name, self.committer.commit, comms, metric=self.ctx.metric)
        for k in ready:
            del self._pending[k]
        self.ctx.metric("committed_checkpoints", len(ready))

    def end_input(self) -> None:
        if self.writer is not None:
            self.writer.end_input()

    def close(self) -> None:
        try:
            for part in (self.writer, self.compactor, self.committer):
                if part is not None:
                    part.close()
        finally:
            if self.backend is not None:
                self.backend.dispose()


class SinkWriterOperator(Operator):
    """The writer stage of a sink that ``compacts``: writes, and hands its committables downstream.

    At every barrier (and once more at the checkpoint after end of input: ``emits_at_checkpoint``) it
    pre-commits and sends the committables ahead of the barrier, as rows keyed by the compactor's key, to the
    compactor/committer stage (:class:`SinkOperator` with ``collect=True``) over an aligned-only exchange.
    State: the writer's state.
    """

    operator_state_distribution = "round_robin"
    emits_at_checkpoint = True

    def __init__(self, name: str, sink: Sink[Any]) -> None:
        super().__init__(name)
        self.sink = sink
        self.writer: SinkWriter[Any]
        self._key: Callable[[Any], str]
        self._restored: list[Any] = []
        self.backend: KeyedStateBackend | None = None

    def setup(self, ctx: OperatorContext, output: Collector) -> None:
        super().setup(ctx, output)
        if self.sink.keyed_writer:
            self.backend = ctx.create_keyed_backend(self.name)

    def initialize_state(self, keyed: list[dict[str, Any]], operator_states: list[Any]) -> None:
        if keyed and self.backend is not None:
            self.backend.restore(keyed)
        states = [unpack_writer_state(self.sink, st.get("writer"), self.name) for st in operator_states if st]
        self._restored = [w for w in states if w is not None]

    def open(self) -> None:
        self.writer = self.sink.create_writer(_Ctx(self), self._restored)
        compactor = self.sink.create_compactor(_Ctx(self))
        if compactor is None:
            raise ConfigError(f"sink {self.name!r}: compacts=True but create_compactor() returned None")
        self._key = compactor.key

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        self.writer.write(batch)
        self.ctx.metric(SINK_RECORDS, batch.num_rows)

    def prepare_snapshot_pre_barrier(self, checkpoint_id: int) -> None:
        comms = self.writer.prepare_commit(checkpoint_id)
        if comms:
            self.output.emit(encode_committables(comms, self._key, self.sink.committable_serializer()))

    def snapshot_state(self, checkpoint_id: int, savepoint: bool = False) -> OperatorSnapshot:
        state = pack_writer_state(self.sink, self.writer.snapshot_state(checkpoint_id))
        keyed = self.backend.snapshot(checkpoint_id, savepoint) if self.backend is not None else None
        return OperatorSnapshot(keyed=keyed, operator={"writer": state})

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        if self.backend is not None:
            self.backend.notify_checkpoint_complete(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        if self.backend is not None:
            self.backend.notify_checkpoint_aborted(checkpoint_id)

    def end_input(self) -> None:
        self.writer.end_input()

    def close(self) -> None:
        try:
            if hasattr(self, "writer"):
                self.writer.close()
        finally:
            if self.backend is not None:
                self.backend.dispose()


class _Ctx:
    """SinkContext view of the operator context."""

    def __init__(self, op: SinkOperator | SinkWriterOperator) -> None:
        self._c = op.ctx
        self._op = op

    @property
    def subtask(self) -> int:
        return self._c.subtask

    @property
    def parallelism(self) -> int:
        return self._c.parallelism

    @property
    def job_id(self) -> str:
        return self._c.job_id

    @property
    def attempt(self) -> int:
        return self._c.attempt

    def metric(self, name: str, increment: int = 1) -> None:
        self._c.metric(name, increment)

    def gauge(self, name: str, value: float) -> None:
        self._c.gauge(name, value)

    def fault_hook(self, point: str) -> None:
        self._c.fault_hook(point)

    def keyed_state(self) -> KeyedStateBackend:
        if self._op.backend is None:
            raise ConfigError(
                f"sink {self._op.name!r}: its writer asked for keyed state, but the sink does not declare "
                "keyed_writer=True (or this is its compactor stage)"
            )
        return self._op.backend


class NodeAdder(Protocol):
    """Adds a node to a pipeline's graph (``Pipeline._add``): its label, name, operator factory (given the
    node's uid), parallelism, inputs, and the node's other fields."""

    def __call__(
        self,
        label: str,
        name: str | None,
        make: Callable[[str], Any],
        parallelism: int | None,
        inputs: list[LogicalEdge],
        **kw: Any,
    ) -> LogicalNode: ...


def add_sink(
    graph: LogicalGraph,
    add: NodeAdder,
    sink: Sink[Any],
    edge: LogicalEdge,
    name: str,
    parallelism: int | None,
    uid: str | None,
) -> LogicalNode:
    """Add the operators of ``sink`` fed by ``edge``; returns the committing node.

    A sink that ``compacts`` becomes two operators: ``<name>.writer`` and ``<name>`` (the compactor and
    committer), joined by an exchange keyed by the compactor's key and never unaligned. ``uid`` names
    their state (``<uid>.writer`` and ``<uid>``).
    """
    if sink.compacts:
        writer = add("sink-writer", f"{name}.writer", lambda n: SinkWriterOperator(n, sink), parallelism, [edge])
        if uid is not None:
            graph.set_uid(writer, f"{uid}.writer")
        edge = LogicalEdge(writer.id, Partitioning.HASH, KeySelector("key"), aligned=True)
    node = add(
        "sink",
        name,
        lambda n: SinkOperator(n, sink, collect=sink.compacts),
        parallelism,
        [edge],
        kind=NodeKind.SINK,
        spec=sink,
    )
    if uid is not None:
        graph.set_uid(node, uid)
    return node
