"""Sink SPI: two-phase commit with a writer per subtask, an idempotent committer, an optional global committer.

Lifecycle of the data a writer receives::

    write(batch) ... -> barrier n: prepare_commit(n) -> committables  (stored in checkpoint n)
                     -> checkpoint_complete(n): Committer.commit(committables of every checkpoint <= n)
                     -> after a restore of checkpoint n: commit(committables of n) again, so commit is
                        idempotent; Sink.recover() aborts everything that belonged to later attempts.

Committables and writer states go into checkpoints through the sink's versioned serializers
(:meth:`Sink.committable_serializer`, :meth:`Sink.writer_state_serializer`; :mod:`sluice.serializers`).
:class:`GlobalCommitter` runs once per checkpoint on the coordinator, for
table formats that need one atomic commit recording the checkpoint id in the table. A sink that
``compacts`` runs as two stages: writers hand their committables downstream at the barrier, keyed by
:meth:`Compactor.key`; one compactor subtask per key merges them in the asynchronous part of the same
checkpoint and commits (or hands to the global committer) what replaces them.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import pyarrow as pa

from sluice.serializers import PickleSerializer, SimpleVersionedSerializer

__all__ = [
    "CommitOutcome",
    "CommittableWithLineage",
    "Committer",
    "Compactor",
    "GlobalCommitter",
    "GlobalCommitterContext",
    "Sink",
    "SinkContext",
    "SinkWriter",
]

C = TypeVar("C")


class SinkContext(Protocol):
    """What a writer or committer knows of its subtask and job.

    ``metric(name, n)`` adds to a counter and ``gauge(name, value)`` sets a value, as for a source reader
    (:class:`sluice.source.ReaderContext`). ``fault_hook(point)`` is for fault-injection tests: a sink calls
    it at the points it owns (``"commit"``, in the middle of a commit); it does nothing unless a test armed
    it.
    """

    @property
    def subtask(self) -> int: ...
    @property
    def parallelism(self) -> int: ...
    @property
    def job_id(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    def metric(self, name: str, increment: int = 1) -> None: ...
    def gauge(self, name: str, value: float) -> None: ...
    def fault_hook(self, point: str) -> None: ...


class GlobalCommitterContext(Protocol):
    """What the global committer (on the coordinator) knows of its job and sink."""

    @property
    def job_id(self) -> str: ...
    @property
    def sink_uid(self) -> str:
        """The sink operator's stable uid: with ``job_id``, it names this sink's commits in a table."""
    @property
    def attempt(self) -> int: ...
    @property
    def restored_checkpoint_id(self) -> int | None:
        """The checkpoint this attempt restored (its committables are committed again first), or None."""
    def metric(self, name: str, increment: int = 1) -> None: ...
    def fault_hook(self, point: str) -> None: ...


@dataclass(frozen=True)
class CommittableWithLineage(Generic[C]):
    """A committable on its way to the global committer, with the checkpoint whose pre-commit made it.

    A checkpoint that fails keeps its committables in the sink until a later one completes; the coordinator
    uses ``checkpoint_id`` to hand every committable to the global committer exactly once (as Flink's
    ``CommittableWithLineage``).
    """

    checkpoint_id: int
    committable: C


class SinkWriter(ABC, Generic[C]):
    """Buffers or stages data; hands over committables at each checkpoint."""

    @abstractmethod
    def write(self, batch: pa.RecordBatch) -> None:
        """Stage ``batch``: nothing written here may be visible to readers yet."""

    @abstractmethod
    def prepare_commit(self, checkpoint_id: int) -> list[C]:
        """Pre-commit: make staged data durable and return what the committer needs to publish it."""

    def snapshot_state(self, checkpoint_id: int) -> Any:
        """Writer state to resume from (e.g. open files), or None (then no writer-state serializer is used)."""
        return None

    def end_input(self) -> None:
        """No more data: the next prepare_commit is the final one."""

    def close(self) -> None:
        """Release resources; uncommitted staged data is left for Sink.recover to clean up."""


class Compactor(ABC, Generic[C]):
    """Merges small staged data of all writer subtasks before it is committed (Flink's compacting sinks).

    The engine routes every committable to the compactor subtask of its :meth:`key` (a partition or bucket),
    so the files that all writers staged for one key at checkpoint n meet in one place. :meth:`compact` runs
    in the asynchronous part of checkpoint n, before its acknowledgement: readers see the merged data when
    n completes, no later than without compaction.
    """

    @abstractmethod
    def key(self, committable: C) -> str:
        """The partition or bucket of ``committable``: committables with equal keys are merged together."""

    @abstractmethod
    def compact(self, checkpoint_id: int, committables: list[C]) -> list[C]:
        """Merge the staged data of ``committables`` (all of one key); return the committables replacing them.

        Runs on the upload thread of checkpoint ``checkpoint_id``. It must touch only what ``committables``
        name and leave the originals until the replacement is durable: a crash anywhere leaves a checkpoint
        that never completes, and :meth:`Sink.recover` deletes what the restored checkpoint does not name.
        """

    def close(self) -> None:
        """Release resources."""


class CommitOutcome(enum.Enum):
    """What a commit did (Flink's ``CommitRequest`` signals, as a return value).

    The engine retries ``RETRY_LATER`` exactly as it retries a raised exception (exponential backoff, a
    bounded number of attempts, then the job fails over and the restored checkpoint is committed again),
    but counts it apart: a known, transient refusal (a table's commit conflict, a throttled store) is not an
    error. ``ALREADY_COMMITTED`` is counted too: after a restore it is the expected answer.
    """

    #: the committables are now visible (some or all were published by this call)
    COMMITTED = "committed"
    #: every committable was visible already (a retry, or the re-commit after a restore)
    ALREADY_COMMITTED = "already_committed"
    #: nothing was published, for a transient reason: call again later with the same committables
    RETRY_LATER = "retry_later"


class Committer(ABC, Generic[C]):
    """Publishes committables. Must be idempotent: the same committable may be committed again."""

    @abstractmethod
    def commit(self, committables: Sequence[C]) -> CommitOutcome:
        """Publish every committable, oldest first, and say what happened.

        Raise (or return ``RETRY_LATER``) to have the commit retried; a partial commit must be safe to
        repeat, since the retry passes the same committables again.
        """

    def close(self) -> None:
        """Release resources."""


class GlobalCommitter(ABC, Generic[C]):
    """One atomic commit per checkpoint, on the coordinator (table formats)."""

    @abstractmethod
    def commit(self, checkpoint_id: int, committables: Sequence[C]) -> CommitOutcome:
        """Publish all committables of ``checkpoint_id`` atomically; ``ALREADY_COMMITTED`` if the table
        already has it (the committer must check: the engine commits the restored checkpoint again).

        An error a restart cannot cure (a ``ConfigError``) is not retried: it fails the job at once."""

    def close(self) -> None:
        """The attempt ended: release resources (called on the coordinator, after the last commit)."""


class Sink(ABC, Generic[C]):
    """A two-phase-commit sink. Subclasses are the file and table sinks, or your own.

    Attributes:
        name: the default operator name.
        global_commit: True if committables go to one :class:`GlobalCommitter` per job (table formats:
            one atomic commit per checkpoint) instead of a per-subtask :class:`Committer`.
        compacts: True if :meth:`create_compactor` returns a compactor: the job then runs the sink as a
            writer stage and a compactor/committer stage keyed by :meth:`Compactor.key`.
    """

    name: str = "sink"
    global_commit: bool = False
    compacts: bool = False

    @abstractmethod
    def create_writer(self, ctx: SinkContext, restored: list[Any]) -> SinkWriter[C]:
        """A writer for one subtask; ``restored`` holds the writer states assigned to it (may be empty)."""

    def create_committer(self, ctx: SinkContext) -> Committer[C] | None:
        """The per-subtask committer, or None if only a global committer is used."""
        return None

    def create_compactor(self, ctx: SinkContext) -> Compactor[C] | None:
        """The compactor of one compactor subtask (called when ``compacts``)."""
        return None

    def create_global_committer(self, ctx: GlobalCommitterContext) -> GlobalCommitter[C] | None:
        """The global committer (called on the coordinator, once per attempt, when ``global_commit``)."""
        return None

    def committed_checkpoint(self, job_id: str, sink_uid: str) -> int | None:
        """The highest checkpoint id of ``job_id`` (and this sink, ``sink_uid``) whose data the output already
        holds, read from the output itself (a table's recorded checkpoint id, the file sink's file names);
        ``0`` if none, None if this sink keeps no such record (then nothing is checked).

        Called on the driver before :meth:`recover` and before any writer starts. The engine refuses to run
        an attempt that restores an older checkpoint than this (or none), since the data after it would be
        written a second time, unless the job allows reprocessing; then the new checkpoint ids continue
        above it.
        """
        return None

    def probe(self) -> None:
        """Check, once at job start (on the driver, before the first attempt), that the output can be
        reached and written: write and delete a small file, connect, look the table or topic up.

        Raise an exception whose message names the sink and the option to fix (``FileSink path '/data/x'
        is not writable: ...``); the job then fails at once with that one line, naming the operator too,
        and no restart is spent. The default checks nothing.
        """

    def recover(self, job_id: str, committables: Sequence[C]) -> None:
        """Before (re)starting: abort staged data of ``job_id`` not in ``committables`` (the restored checkpoint's)."""

    def validate(self) -> None:
        """Check options at job build time; raise ConfigError naming the option."""

    def committable_serializer(self) -> SimpleVersionedSerializer[C]:
        """How this sink's committables are written into checkpoints (pending ones in the task state, the
        global committer's in ``_metadata``).

        The default pickles (safe only because checkpoint files are signed with the job's key: see
        docs/security.md); return a :class:`~sluice.serializers.JsonSerializer` to store plain data.
        """
        return PickleSerializer()

    def writer_state_serializer(self) -> SimpleVersionedSerializer[Any]:
        """How a writer's :meth:`SinkWriter.snapshot_state` (when not None) is written into checkpoints.
        Default: pickle, as :meth:`committable_serializer`."""
        return PickleSerializer()

    def restore_config(self) -> dict[str, Any] | None:
        """The settings the sink's checkpointed state (staged data, pending committables) depends on, e.g. an
        upsert sink's mode and key columns: recorded in every checkpoint and compared at restore
        (:mod:`sluice.runtime.upgrades`). None (the default): nothing to compare."""
        return None

    def input_key_columns(self, schema: pa.Schema | None) -> list[str] | None:
        """The columns the sink's input must be hash-partitioned by, so that every record of a key reaches
        one writer subtask in the order it was produced (an upsert of plain rows: the last row per key
        wins); None (the default): any partitioning. ``schema`` is the stream's, None where the job does not
        know it when it is built."""
        return None

    def validate_schema(self, schema: pa.Schema) -> None:
        """Check, at job build time, that this sink can write ``schema`` (the stream's, when the job knows
        it); raise ConfigError naming the sink and the column. The writer checks again at run time."""
