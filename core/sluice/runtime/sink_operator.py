"""The operators that run a two-phase-commit sink: its writer and its committer (chained in one task), or
for a sink that compacts, a writer stage and a compactor/committer stage keyed by the compactor's key."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import tenacity

from sluice.checkpoint.codec import envelope, open_envelope, read_commit_groups, write_commit_groups
from sluice.checkpoint.global_commit import CommitGroups
from sluice.errors import CommitError, ConfigError, is_recoverable
from sluice.runtime.operators import Operator, OperatorSnapshot
from sluice.runtime.task_metrics import SINK_RECORDS
from sluice.serializers import SimpleVersionedSerializer
from sluice.sink import CommitOutcome, CommittableWithLineage, Committer, Compactor, Sink, SinkWriter

__all__ = [
    "COMMITTABLES",
    "SinkOperator",
    "SinkWriterOperator",
    "commit_with_retry",
    "decode_committables",
    "encode_committables",
    "pack_pending",
    "pack_writer_state",
    "unpack_pending",
    "unpack_writer_state",
]

log = logging.getLogger("sluice.sink")


class _RetryLater(Exception):
    """A committer returned ``CommitOutcome.RETRY_LATER``: retried like an error, counted apart."""


def commit_with_retry(
    name: str,
    commit: Callable[..., CommitOutcome | None],
    *args: Any,
    attempts: int = 5,
    metric: Callable[[str, int], None] | None = None,
) -> CommitOutcome:
    """Call ``commit(*args)``, retrying failures and ``RETRY_LATER`` with exponential backoff (tenacity).

    Returns the outcome (a committer written before outcomes existed returns None: counted as committed).
    An error a restart cannot cure (``sluice.errors.is_recoverable``, e.g. a ConfigError) is raised at once.
    Metrics: ``commits`` and ``commits_already_committed`` per call, ``commit_retries`` per retry,
    ``commit_time_us`` the time the call took (retries included).
    """
    count = metric or (lambda _name, _n: None)

    def once() -> CommitOutcome:
        outcome = commit(*args) or CommitOutcome.COMMITTED
        if outcome is CommitOutcome.RETRY_LATER:
            raise _RetryLater("the committer asked to retry later")
        return outcome

    def before_sleep(rs: tenacity.RetryCallState) -> None:
        count("commit_retries", 1)
        exc = rs.outcome.exception() if rs.outcome is not None else None
        level = logging.INFO if isinstance(exc, _RetryLater) else logging.WARNING
        log.log(level, "%s: commit not done (attempt %d), retrying: %s", name, rs.attempt_number, exc)

    started = time.perf_counter()
    try:
        outcome: CommitOutcome = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(attempts),
            wait=tenacity.wait_exponential(multiplier=0.05, max=2.0),
            retry=tenacity.retry_if_exception(lambda e: isinstance(e, Exception) and is_recoverable(e)),
            reraise=True,
            before_sleep=before_sleep,
        )(once)
    except Exception as exc:
        if not is_recoverable(exc):
            raise  # neither a retry nor a restart can cure it: fails the job at once
        raise CommitError(f"sink {name!r}: commit failed after {attempts} attempts: {exc}") from exc
    count("commits" if outcome is CommitOutcome.COMMITTED else "commits_already_committed", 1)
    count("commit_time_us", int((time.perf_counter() - started) * 1e6))
    return outcome


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

    def initialize_state(self, keyed: dict[int, bytes], operator_states: list[Any]) -> None:
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

    def snapshot_state(self, checkpoint_id: int) -> OperatorSnapshot:
        writer_state = self.writer.snapshot_state(checkpoint_id) if self.writer is not None else None
        snap = OperatorSnapshot(operator={"writer": pack_writer_state(self.sink, writer_state), "pending": []})
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
        self.ctx.fault_hook("complete_to_commit")
        self._commit_upto(checkpoint_id)

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
        for part in (self.writer, self.compactor, self.committer):
            if part is not None:
                part.close()


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

    def initialize_state(self, keyed: dict[int, bytes], operator_states: list[Any]) -> None:
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

    def snapshot_state(self, checkpoint_id: int) -> OperatorSnapshot:
        state = pack_writer_state(self.sink, self.writer.snapshot_state(checkpoint_id))
        return OperatorSnapshot(operator={"writer": state})

    def end_input(self) -> None:
        self.writer.end_input()

    def close(self) -> None:
        if hasattr(self, "writer"):
            self.writer.close()


def pack_writer_state(sink: Sink[Any], state: Any) -> Any:
    """A writer's snapshot as the task state stores it: None, or its sink's writer-state serializer's
    envelope."""
    return None if state is None else envelope(sink.writer_state_serializer(), state)


def unpack_writer_state(sink: Sink[Any], stored: Any, name: str) -> Any:
    """Inverse of :func:`pack_writer_state` (RestoreError naming the sink if it cannot be read)."""
    if stored is None:
        return None
    return open_envelope(sink.writer_state_serializer(), stored, f"sink {name!r}: a writer state")


def pack_pending(sink: Sink[Any], groups: CommitGroups) -> list[Any]:
    """Committables not committed yet, by checkpoint, as the task state stores them."""
    return write_commit_groups(groups, sink.committable_serializer())


def unpack_pending(sink: Sink[Any], stored: Any, name: str) -> CommitGroups:
    """Inverse of :func:`pack_pending`."""
    if not stored:
        return []
    return read_commit_groups(stored, sink.committable_serializer(), f"sink {name!r}: pending committables")


#: the schema of committables travelling from a sink's writer stage to its compactor stage
COMMITTABLES = pa.schema([("key", pa.string()), ("version", pa.int32()), ("committable", pa.binary())])


def encode_committables(
    committables: list[Any], key: Callable[[Any], str], serializer: SimpleVersionedSerializer[Any]
) -> pa.RecordBatch:
    """Committables as rows: the compactor key (for the hash exchange) and the committable, written by the
    sink's committable serializer."""
    return pa.RecordBatch.from_arrays(
        [
            pa.array([key(c) for c in committables], pa.string()),
            pa.array([serializer.version] * len(committables), pa.int32()),
            pa.array([serializer.serialize(c) for c in committables], pa.binary()),
        ],
        schema=COMMITTABLES,
    )


def decode_committables(batch: pa.RecordBatch, serializer: SimpleVersionedSerializer[Any]) -> list[Any]:
    """Inverse of :func:`encode_committables`."""
    versions = batch.column("version").to_pylist()
    data = batch.column("committable").to_pylist()
    return [serializer.deserialize(v, b) for v, b in zip(versions, data, strict=True)]


class _Ctx:
    """SinkContext view of the operator context."""

    def __init__(self, op: SinkOperator | SinkWriterOperator) -> None:
        self._c = op.ctx

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
