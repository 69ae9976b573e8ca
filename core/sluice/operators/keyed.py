"""Keyed operators: a KeyedProcessFunction per key of each batch, with keyed state and timers; reduce."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from sluice.functions import KeyedProcessFunction, Output
from sluice.keys import KeySelector
from sluice.operators.base import (
    MIN_WATERMARK,
    Collector,
    Operator,
    OperatorContext,
    OperatorSnapshot,
    to_batches,
)
from sluice.operators.timers import KeyedTimers
from sluice.state.api import StateDescriptor
from sluice.state.backend import InMemoryStateBackend

__all__ = ["KeyedProcessOperator", "ReduceFunction"]


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
        self._op.timers.register(KeyedTimers.EVENT, timestamp, self._op.current_kg, self.key)

    def register_processing_time_timer(self, timestamp: int) -> None:
        self._op.timers.register(KeyedTimers.PROC, timestamp, self._op.current_kg, self.key)

    def delete_event_time_timer(self, timestamp: int) -> None:
        self._op.timers.delete(KeyedTimers.EVENT, timestamp, self.key)

    def delete_processing_time_timer(self, timestamp: int) -> None:
        self._op.timers.delete(KeyedTimers.PROC, timestamp, self.key)


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
        self.timers = KeyedTimers()
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
        self._fire(KeyedTimers.EVENT, timestamp)
        self.output.emit_watermark(timestamp)

    def on_processing_time(self, now_ms: int) -> None:
        self._fire(KeyedTimers.PROC, now_ms)

    def next_timer_ms(self) -> int | None:
        return self.timers.next_ts(KeyedTimers.PROC)

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
