"""Operators: what a task runs, one instance per subtask, always from the task's single thread.

An operator receives batches and watermarks, emits through its :class:`Collector`, and takes part in
checkpoints: ``prepare_snapshot_pre_barrier`` (flush, e.g. a sink's pre-commit), ``snapshot_state``
(synchronous, cheap), ``notify_checkpoint_complete`` / ``_aborted``.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from sluice.checkpoint.snapshot import OperatorSnapshot
from sluice.errors import ConfigError, UserFunctionError
from sluice.functions import KeyedProcessFunction, Output
from sluice.keys import KeySelector
from sluice.state.api import StateDescriptor
from sluice.state.backend import InMemoryStateBackend
from sluice.state.keygroups import KeyGroupRange

__all__ = [
    "Collector",
    "FilterOperator",
    "FlatMapOperator",
    "KeyedProcessOperator",
    "MapBatchesOperator",
    "MapOperator",
    "Operator",
    "OperatorContext",
    "OperatorSnapshot",
    "PassThroughOperator",
    "ReduceFunction",
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

    def __init__(self, name: str) -> None:
        self.name = name
        self.ctx: OperatorContext
        self.output: Collector

    def setup(self, ctx: OperatorContext, output: Collector) -> None:
        self.ctx = ctx
        self.output = output

    def initialize_state(self, keyed: dict[int, bytes], operator_states: list[Any]) -> None:
        """Restore: ``keyed`` holds serialized key groups (already filtered to ours by the caller or not);
        ``operator_states`` the operator states assigned to this subtask."""

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

    def snapshot_state(self, checkpoint_id: int) -> OperatorSnapshot:
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


class PassThroughOperator(Operator):
    """Union and explicit exchanges: forwards everything."""


class MapBatchesOperator(Operator):
    """``fn(batch) -> batch | table | batches | None``: the vectorized workhorse."""

    def __init__(self, name: str, fn: Callable[[pa.RecordBatch], Any]) -> None:
        super().__init__(name)
        self.fn = fn

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        for out in to_batches(self._call(self.fn, batch)):
            self.output.emit(out)


class FilterOperator(Operator):
    """Keeps rows where a pyarrow compute expression (or ``fn(batch) -> boolean array``) is true."""

    def __init__(self, name: str, predicate: pc.Expression | Callable[[pa.RecordBatch], Any]) -> None:
        super().__init__(name)
        if not isinstance(predicate, pc.Expression) and not callable(predicate):
            raise ConfigError(
                f"filter {name!r}: predicate must be a pyarrow.compute.Expression or a function"
            )
        self.predicate = predicate

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if isinstance(self.predicate, pc.Expression):
            out = self._call(lambda b: pa.Table.from_batches([b]).filter(self.predicate), batch)
            for b in to_batches(out.combine_chunks()):
                self.output.emit(b)
        else:
            mask = self._call(self.predicate, batch)
            out = batch.filter(mask)
            if out.num_rows:
                self.output.emit(out)


class MapOperator(Operator):
    """Per record: ``fn(row: dict) -> dict``. Convenient and slow (a Python call per record)."""

    def __init__(
        self, name: str, fn: Callable[[dict[str, Any]], dict[str, Any]], schema: pa.Schema | None
    ) -> None:
        super().__init__(name)
        self.fn = fn
        self.schema = schema

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        rows = [self._call(self.fn, r) for r in batch.to_pylist()]
        for out in to_batches(rows, self.schema):
            self.output.emit(out)


class FlatMapOperator(Operator):
    """Per record: ``fn(row: dict) -> iterable of dicts``. Convenient and slow."""

    def __init__(
        self, name: str, fn: Callable[[dict[str, Any]], Iterable[dict[str, Any]]], schema: pa.Schema | None
    ) -> None:
        super().__init__(name)
        self.fn = fn
        self.schema = schema

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        rows: list[dict[str, Any]] = []
        for r in batch.to_pylist():
            rows.extend(self._call(lambda x: list(self.fn(x)), r))
        for out in to_batches(rows, self.schema):
            self.output.emit(out)


class _Timers:
    """Event- and processing-time timers of one operator, by key group, deduplicated."""

    EVENT, PROC = 0, 1

    def __init__(self) -> None:
        self._heaps: tuple[list[tuple[int, int, int, Any]], list[tuple[int, int, int, Any]]] = ([], [])
        self._live: set[tuple[int, int, Any]] = set()  # (domain, ts, key)
        self._seq = 0

    def register(self, domain: int, ts: int, kg: int, key: Any) -> None:
        ident = (domain, ts, key)
        if ident not in self._live:
            self._live.add(ident)
            self._seq += 1
            heapq.heappush(self._heaps[domain], (ts, self._seq, kg, key))

    def delete(self, domain: int, ts: int, key: Any) -> None:
        self._live.discard((domain, ts, key))

    def pop_due(self, domain: int, upto: int) -> Iterable[tuple[int, int, Any]]:
        heap = self._heaps[domain]
        while heap and heap[0][0] <= upto:
            ts, _, kg, key = heapq.heappop(heap)
            if (domain, ts, key) in self._live:
                self._live.discard((domain, ts, key))
                yield ts, kg, key

    def next_ts(self, domain: int) -> int | None:
        heap = self._heaps[domain]
        while heap and (domain, heap[0][0], heap[0][3]) not in self._live:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def snapshot(self) -> list[tuple[int, int, int, Any]]:
        return [
            (d, ts, kg, key)
            for d in (0, 1)
            for ts, _, kg, key in self._heaps[d]
            if (d, ts, key) in self._live
        ]

    def restore(self, entries: Iterable[tuple[int, int, int, Any]], key_groups: KeyGroupRange) -> None:
        for d, ts, kg, key in entries:
            if kg in key_groups:
                self.register(d, ts, kg, key)


class _KeyedCtx:
    """The KeyedContext and TimerService handed to KeyedProcessFunction calls (one object, reused)."""

    def __init__(self, op: KeyedProcessOperator) -> None:
        self._op = op
        self.timestamp: int | None = None

    # RuntimeContext
    @property
    def subtask(self) -> int:
        return self._op.ctx.subtask

    @property
    def parallelism(self) -> int:
        return self._op.ctx.parallelism

    @property
    def operator_name(self) -> str:
        return self._op.name

    def state(self, descriptor: StateDescriptor) -> Any:
        return self._op.backend.state(descriptor)

    # KeyedContext
    @property
    def key(self) -> Any:
        return self._op.backend.current_key

    @property
    def timer_service(self) -> _KeyedCtx:
        return self

    # TimerService
    def current_processing_time(self) -> int:
        return int(time.time() * 1000)

    def current_watermark(self) -> int:
        return self._op.watermark

    def register_event_time_timer(self, timestamp: int) -> None:
        self._op.timers.register(_Timers.EVENT, timestamp, self._op.current_kg, self.key)

    def register_processing_time_timer(self, timestamp: int) -> None:
        self._op.timers.register(_Timers.PROC, timestamp, self._op.current_kg, self.key)

    def delete_event_time_timer(self, timestamp: int) -> None:
        self._op.timers.delete(_Timers.EVENT, timestamp, self.key)

    def delete_processing_time_timer(self, timestamp: int) -> None:
        self._op.timers.delete(_Timers.PROC, timestamp, self.key)


class KeyedProcessOperator(Operator):
    """Runs a KeyedProcessFunction per key of each batch, with keyed state and timers."""

    operator_state_distribution = "union"

    def __init__(
        self, name: str, key: KeySelector, fn: KeyedProcessFunction, schema: pa.Schema | None = None
    ) -> None:
        super().__init__(name)
        self.key = key
        self.fn = fn
        self.schema = schema
        self.timers = _Timers()
        self.watermark = MIN_WATERMARK
        self.current_kg = -1
        self.backend: InMemoryStateBackend

    def setup(self, ctx: OperatorContext, output: Collector) -> None:
        super().setup(ctx, output)
        self.backend = InMemoryStateBackend(ctx.key_groups)
        self._kctx = _KeyedCtx(self)

    def initialize_state(self, keyed: dict[int, bytes], operator_states: list[Any]) -> None:
        self.backend.restore(keyed)
        for st in operator_states:
            self.timers.restore(st or [], self.ctx.key_groups)

    def open(self) -> None:
        self._call(self.fn.open, self._kctx)

    def _set_key(self, key: Any, kg: int) -> None:
        self.current_kg = kg
        self.backend.set_current_key(key, kg)

    def _emit(self, out: Output) -> None:
        for b in to_batches(out, self.schema):
            self.output.emit(b)

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        keys, rows, hashes = self.key.groups(batch)
        mp = self.ctx.max_parallelism
        kctx = self._kctx
        kctx.timestamp = None
        for key, idx, h in zip(keys, rows, hashes, strict=True):
            kg = int(h % mp)
            if kg not in self.ctx.key_groups:
                raise RuntimeError(f"{self.name}: key {key!r} (key group {kg}) routed to the wrong subtask")
            self._set_key(key, kg)
            part = batch if len(idx) == batch.num_rows else batch.take(pa.array(idx))
            self._emit(self._call(self.fn.process, key, part, kctx))

    def _fire(self, domain: int, upto: int) -> None:
        for ts, kg, key in list(self.timers.pop_due(domain, upto)):
            self._set_key(key, kg)
            self._kctx.timestamp = ts
            self._emit(self._call(self.fn.on_timer, ts, key, self._kctx))
        self._kctx.timestamp = None

    def process_watermark(self, timestamp: int) -> None:
        self.watermark = timestamp
        self._fire(_Timers.EVENT, timestamp)
        self.output.emit_watermark(timestamp)

    def on_processing_time(self, now_ms: int) -> None:
        self._fire(_Timers.PROC, now_ms)

    def next_timer_ms(self) -> int | None:
        return self.timers.next_ts(_Timers.PROC)

    def snapshot_state(self, checkpoint_id: int) -> OperatorSnapshot:
        return OperatorSnapshot(keyed=self.backend.snapshot(), operator=self.timers.snapshot())

    def close(self) -> None:
        self._call(self.fn.close)


class ReduceFunction(KeyedProcessFunction):
    """``reduce(fn)``: a running reduction per key, ``fn(acc: dict, row: dict) -> dict``, one output per input.

    Per record, so slow; prefer ``process`` with vectorized code for heavy use.
    """

    def __init__(self, fn: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]) -> None:
        self.fn = fn
        self.desc = StateDescriptor("__reduce__")

    def process(self, key: Any, rows: pa.RecordBatch, ctx: Any) -> Output:
        st = ctx.state(self.desc)
        acc = st.value()
        out = []
        for r in rows.to_pylist():
            acc = r if acc is None else self.fn(acc, r)
            out.append(acc)
        st.update(acc)
        return out
