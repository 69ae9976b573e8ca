"""Source SPI: a split enumerator on the coordinator plus readers in the subtasks (Flink's FLIP-27 shape).

* A :class:`Source` creates one :class:`SplitEnumerator` (discovers splits, assigns them to readers, is
  checkpointed on the coordinator) and one :class:`SourceReader` per subtask.
* A reader reads its assigned splits and snapshots each split's *position*. The position stored for a
  split is where reading resumes after a restore: for Kafka, the next offset to read (not the last one
  read). An off-by-one here duplicates or loses a record.
* On restore, the splits of every reader of the restored checkpoint are handed back to the enumerator
  (:meth:`SplitEnumerator.add_splits_back`), which assigns them again; the same deterministic assignment
  gives the same splits to the same subtask at the same parallelism, and spreads them at another one.
* Splits and the enumerator's state go into checkpoints through the source's versioned serializers
  (:meth:`Source.split_serializer`, :meth:`Source.enumerator_state_serializer`; :mod:`sluice.serializers`).
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa

from sluice.serializers.versioned import PickleSerializer, SimpleVersionedSerializer

__all__ = [
    "Boundedness",
    "EnumeratorContext",
    "InputStatus",
    "ReaderContext",
    "ReaderOutput",
    "Source",
    "SourceReader",
    "SourceSplit",
    "SplitEnumerator",
]


class Boundedness(enum.Enum):
    BOUNDED = "bounded"
    CONTINUOUS = "continuous"


class InputStatus(enum.Enum):
    """What :meth:`SourceReader.poll_next` tells the task."""

    MORE_AVAILABLE = "more"
    NOTHING_AVAILABLE = "nothing"
    END_OF_INPUT = "end"


@dataclass
class SourceSplit:
    """A unit of source work with its position. ``split_id`` must be stable across runs; the source's
    :meth:`~Source.split_serializer` writes it into checkpoints."""

    split_id: str
    position: Any = None
    #: for bounded reads: where the split ends (exclusive), or None
    end: Any = None


class ReaderOutput(Protocol):
    """Where a reader puts what it read."""

    def emit(self, batch: pa.RecordBatch) -> None: ...
    def emit_side(self, tag: str, batch: pa.RecordBatch) -> None: ...
    def emit_watermark(self, timestamp_ms: int) -> None: ...
    def mark_idle(self) -> None:
        """No data for a while: downstream stops waiting for this reader's watermark until the next one."""


class ReaderContext(Protocol):
    """What a reader knows of its subtask, and where it reports its metrics.

    ``metric(name, n)`` adds to a counter, ``gauge(name, value)`` sets a value (the last one counts),
    ``stalled(reason)`` reports that the reader cannot make progress (None: it can again); all are cheap (a dict update, no lock), may be called from a reader's own threads, and show on the control
    endpoint as ``sluice_<name>_total`` and ``sluice_<name>`` per vertex and subtask (see
    docs/operations.md). Call them per batch or less often, never per record.
    """

    @property
    def subtask(self) -> int: ...
    @property
    def parallelism(self) -> int: ...
    @property
    def job_id(self) -> str: ...
    def request_split(self) -> None: ...
    def metric(self, name: str, increment: int = 1) -> None: ...
    def gauge(self, name: str, value: float) -> None: ...
    def stalled(self, reason: str | None) -> None:
        """Say the reader cannot make progress and why (e.g. no broker reachable), or with None that it can
        again. ``sluice status``, the live progress and ``sluice_source_stalled_seconds`` show it with the
        time it began; call it when the state changes (any thread)."""


class EnumeratorContext(Protocol):
    """What an enumerator can do on the coordinator."""

    @property
    def parallelism(self) -> int: ...
    def assign_splits(self, assignment: dict[int, list[SourceSplit]]) -> None: ...
    def signal_no_more_splits(self, subtask: int) -> None: ...
    def registered_readers(self) -> Sequence[int]: ...


class SourceReader(ABC):
    """Reads assigned splits in one subtask. Called only from that subtask's thread."""

    def start(self) -> None:  # noqa: B027 - optional hook
        """Open connections. Called once before the first poll."""

    @abstractmethod
    def add_splits(self, splits: list[SourceSplit]) -> None:
        """Take over ``splits``, resuming each at its position."""

    @abstractmethod
    def notify_no_more_splits(self) -> None:
        """No more splits will be assigned: a bounded reader ends once its splits are done."""

    @abstractmethod
    def poll_next(self, output: ReaderOutput) -> InputStatus:
        """Emit what is available, waiting at most a few tens of milliseconds, and say what comes next."""

    @abstractmethod
    def snapshot_state(self, checkpoint_id: int) -> list[SourceSplit]:
        """The assigned splits with the position to resume from, as of the last emitted batch."""

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:  # noqa: B027 - optional hook
        """Checkpoint ``checkpoint_id`` completed (e.g. commit offsets for lag monitoring)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""


class SplitEnumerator(ABC):
    """Discovers and assigns splits; runs on the coordinator, serialized with its checkpoints."""

    def start(self) -> None:  # noqa: B027 - optional hook
        """Start discovery. Called once, before readers register."""

    @abstractmethod
    def add_reader(self, subtask: int) -> None:
        """Reader ``subtask`` is running and can receive splits."""

    @abstractmethod
    def add_splits_back(self, splits: list[SourceSplit]) -> None:
        """Splits (with positions) that must be assigned again: from a restored checkpoint or a failed reader."""

    def handle_split_request(self, subtask: int) -> None:  # noqa: B027 - optional hook
        """Reader ``subtask`` asked for work (pull-based enumerators)."""

    def poll(self) -> None:  # noqa: B027 - optional hook
        """Called periodically by the coordinator (periodic discovery)."""

    @abstractmethod
    def snapshot_state(self, checkpoint_id: int) -> Any:
        """State for the checkpoint (splits known but not yet assigned, discovery progress), written by the
        source's :meth:`~Source.enumerator_state_serializer`."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""


class Source(ABC):
    """A source of record batches. Subclasses are the connectors (Kafka, generator, your own)."""

    #: name used in metrics, errors and the graph
    name: str = "source"

    @property
    @abstractmethod
    def boundedness(self) -> Boundedness:
        """Bounded sources end, and the job with them after a final checkpoint."""

    @abstractmethod
    def create_enumerator(self, ctx: EnumeratorContext, restored: Any | None) -> SplitEnumerator:
        """The enumerator; ``restored`` is its snapshot from the restored checkpoint, if any."""

    @abstractmethod
    def create_reader(self, ctx: ReaderContext) -> SourceReader:
        """A reader for one subtask."""

    def validate(self) -> None:  # noqa: B027 - optional hook
        """Check options at job build time; raise ConfigError naming the option."""

    @property
    def side_outputs(self) -> tuple[str, ...]:
        """Side-output tags this source emits (e.g. ``("dead_letters",)``); each must be connected to a
        sink, or the job is refused at build time, so no record is silently dropped."""
        return ()

    @property
    def output_schema(self) -> pa.Schema | None:
        """The Arrow schema of the batches this source emits, if known before it runs (else None).

        Sinks check it when the job is built (a column type a format cannot write fails there, not at run
        time); None leaves the check to the sink's writer.
        """
        return None

    @property
    def discovery_interval(self) -> float | None:
        """Seconds between calls of :meth:`SplitEnumerator.poll`, or None."""
        return None

    def split_serializer(self) -> SimpleVersionedSerializer[SourceSplit]:
        """How this source's splits (with their positions) are written into checkpoints.

        The default pickles (safe only because checkpoint files are signed with the job's key: see
        docs/security.md); return a :class:`~sluice.serializers.JsonSerializer` to store plain data
        (:class:`~sluice.serializers.SourceSplitSerializer` for plain ``SourceSplit`` objects).
        """
        return PickleSerializer()

    def enumerator_state_serializer(self) -> SimpleVersionedSerializer[Any]:
        """How this source's enumerator state (:meth:`SplitEnumerator.snapshot_state`) is written into
        checkpoints. Default: pickle, as :meth:`split_serializer`."""
        return PickleSerializer()
