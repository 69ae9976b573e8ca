"""The operator contract: what a task runs, one instance per subtask, always from the task's single thread.

An operator receives batches and watermarks, emits through its :class:`Collector`, and takes part in
checkpoints: ``prepare_snapshot_pre_barrier`` (flush, e.g. a sink's pre-commit), ``snapshot_state``
(synchronous, cheap: an :class:`~sluice.checkpoint.snapshot.OperatorSnapshot`), ``notify_checkpoint_complete``
/ ``_aborted``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa

from sluice.checkpoint.snapshot import OperatorSnapshot
from sluice.errors import UserFunctionError
from sluice.state.keygroups import KeyGroupRange
from sluice.state.spi import KeyedStateBackend, StateBackend
from sluice.state.transfer import FileTransfer

__all__ = [
    "MAX_WATERMARK",
    "MIN_WATERMARK",
    "Collector",
    "Operator",
    "OperatorContext",
    "OperatorSnapshot",
    "to_batches",
]

MIN_WATERMARK = -(2**63)
#: the end of event time: sent when a stopping job drains (every event-time timer fires)
MAX_WATERMARK = 2**63 - 1


class Collector(Protocol):
    """Where an operator's output goes: the next operator of the chain, or the exchanges."""

    def emit(self, batch: pa.RecordBatch) -> None: ...
    def emit_side(self, tag: str, batch: pa.RecordBatch) -> None: ...
    def emit_watermark(self, timestamp: int) -> None: ...
    def has_side(self, tag: str) -> bool:
        """True if a stream reads side output ``tag`` (an optional one, like ``late``, is skipped if not)."""
        ...


@dataclass
class OperatorContext:
    """What an operator knows of its subtask."""

    name: str
    subtask: int
    parallelism: int
    max_parallelism: int
    key_groups: KeyGroupRange
    job_id: str
    attempt: int
    metrics: dict[str, int] = field(default_factory=dict)
    #: set by the task: the fault injector's hook, called at named points
    fault_hook: Callable[[str], None] = lambda point: None
    #: values set with :meth:`gauge` (the last one counts)
    gauges: dict[str, float] = field(default_factory=dict)
    stall: tuple[float, str] | None = None  #: (since, epoch s; reason) while a source reader is stalled
    #: the job's state backend in this process (None: the default hashmap backend)
    state_backend: StateBackend | None = None
    #: where keyed state backends put their checkpoint files (the job's checkpoint storage; None: a
    #: temporary folder, for operators run outside a job)
    state_files: FileTransfer | None = None
    #: the keyed backends :meth:`create_keyed_backend` made (the task runs their periodic work between batches)
    keyed_backends: list[KeyedStateBackend] = field(default_factory=list)

    def create_keyed_backend(self, uid: str, clock: Callable[[], int] | None = None) -> KeyedStateBackend:
        """A keyed state backend for operator ``uid`` in this subtask, over the key groups it owns: per-key
        and batch-wise state access (:meth:`~sluice.state.spi.KeyedStateBackend.batch_state`), timers, and
        snapshots the subtask's checkpoints carry (``OperatorSnapshot.keyed``). The operator disposes of it
        when it closes. ``clock`` (ms) is the time state TTL follows (default: processing time; an operator
        whose state expires in event time passes its watermark)."""
        import hashlib
        import re
        import tempfile

        from sluice.state.config import StateBackendConfig
        from sluice.state.factory import state_backend_for
        from sluice.state.transfer import LocalFileTransfer

        backend = self.state_backend or state_backend_for(StateBackendConfig())
        files = self.state_files or LocalFileTransfer(tempfile.mkdtemp(prefix="sluice-state-"))
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", uid)[:64]
        owner = f"{safe}-{hashlib.sha256(uid.encode()).hexdigest()[:8]}-{self.subtask}"
        keyed = backend.create_keyed_backend(owner, self.key_groups, self.max_parallelism, files, clock)
        self.keyed_backends.append(keyed)
        return keyed

    def metric(self, name: str, increment: int = 1) -> None:
        """Add ``increment`` to the counter ``name``."""
        self.metrics[name] = self.metrics.get(name, 0) + increment

    def gauge(self, name: str, value: float) -> None:
        """Set the gauge ``name`` to ``value`` (e.g. a reader's lag)."""
        self.gauges[name] = value


def to_batches(out: Any, schema: pa.Schema | None = None) -> list[pa.RecordBatch]:
    """Normalize what a user function returned into record batches."""
    if out is None:
        return []
    if isinstance(out, pa.RecordBatch):
        return [out] if out.num_rows else []
    if isinstance(out, pa.Table):
        return [b for b in out.to_batches() if b.num_rows]
    if isinstance(out, dict):
        return [pa.RecordBatch.from_pylist([out], schema=schema)]
    items = list(out) if isinstance(out, Iterable) else [out]
    if not items:
        return []
    if all(isinstance(i, pa.RecordBatch) for i in items):
        return [b for b in items if b.num_rows]
    if all(isinstance(i, dict) for i in items):
        return [pa.RecordBatch.from_pylist(items, schema=schema)]
    raise TypeError(f"a function returned {type(items[0]).__name__}; expected RecordBatch, Table or dicts")


class Operator:
    """Base operator: passes batches and watermarks through unchanged."""

    #: how operator states of the old subtasks are spread on restore: "round_robin" (old subtask j goes to
    #: new subtask j % parallelism) or "union" (every new subtask gets all, e.g. timers filtered by key group)
    operator_state_distribution = "round_robin"
    #: emits records in ``prepare_snapshot_pre_barrier`` even after its input ended (a sink's writer stage
    #: hands its last committables over at the final checkpoint): its task keeps its outputs open until the
    #: first checkpoint after end of input, and sends end of partition behind that checkpoint's barrier
    emits_at_checkpoint = False
    #: per input index: seconds without data or watermark after which a channel of that input leaves the
    #: task's watermark minimum until it delivers again (``join_latest``'s table side; the head operator's)
    input_idle_timeouts: dict[int, float] = {}

    def __init__(self, name: str) -> None:
        self.name = name
        self.ctx: OperatorContext
        self.output: Collector

    def setup(self, ctx: OperatorContext, output: Collector) -> None:
        self.ctx = ctx
        self.output = output

    def initialize_state(self, keyed: list[dict[str, Any]], operator_states: list[Any]) -> None:
        """Restore: ``keyed`` holds the keyed state handles of the old subtasks whose key groups overlap
        this subtask's (for :meth:`~sluice.state.spi.KeyedStateBackend.restore`); ``operator_states`` the
        operator states assigned to this subtask."""

    def open(self) -> None:
        """Called once after state is initialized, before input."""

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        self.output.emit(batch)

    def process_watermark(self, timestamp: int) -> None:
        self.output.emit_watermark(timestamp)

    def on_processing_time(self, now_ms: int) -> None:
        """Fire due processing-time timers."""

    def next_timer_ms(self) -> int | None:
        """The earliest pending processing-time timer, or None."""
        return None

    def prepare_snapshot_pre_barrier(self, checkpoint_id: int) -> None:
        """Flush before the barrier goes downstream (emitted data then belongs to this checkpoint)."""

    def snapshot_state(self, checkpoint_id: int, savepoint: bool = False) -> OperatorSnapshot:
        """The synchronous part of checkpoint ``checkpoint_id`` (a savepoint: keyed state in the canonical
        format, which either state backend restores)."""
        return OperatorSnapshot()

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed."""

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` was aborted."""

    def end_input(self) -> None:
        """All inputs ended."""

    def close(self) -> None:
        """Release resources."""

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a user function, wrapping its failure with this operator's name."""
        try:
            return fn(*args)
        except UserFunctionError:
            raise
        except Exception as exc:
            raise UserFunctionError(self.name, exc) from exc
