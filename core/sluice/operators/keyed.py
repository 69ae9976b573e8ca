"""Keyed operators: a KeyedProcessFunction per key of each batch, with keyed state and timers; reduce.

Keyed state and timers live in the job's state backend (``Pipeline(state_backend=...)``: hashmap or
RocksDB), one keyed backend per operator subtask over the key groups it owns (:mod:`sluice.state.spi`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from sluice.errors import ConfigError
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
from sluice.state.api import StateDescriptor
from sluice.state.keycodec import decode_key, encode_key
from sluice.state.spi import KeyedStateBackend, TimeDomain

__all__ = ["KeyedProcessOperator", "ReduceFunction"]

_UNKNOWN = -1  # the next processing-time timer must be looked up in the backend


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
        self._op.timer(TimeDomain.EVENT, int(timestamp), register=True)

    def register_processing_time_timer(self, timestamp: int) -> None:
        self._op.timer(TimeDomain.PROCESSING, int(timestamp), register=True)

    def delete_event_time_timer(self, timestamp: int) -> None:
        self._op.timer(TimeDomain.EVENT, int(timestamp), register=False)

    def delete_processing_time_timer(self, timestamp: int) -> None:
        self._op.timer(TimeDomain.PROCESSING, int(timestamp), register=False)


class KeyedProcessOperator(Operator):
    """Runs a KeyedProcessFunction per key of each batch, with keyed state and timers in the job's state
    backend."""

    def __init__(
        self, name: str, key: KeySelector, fn: KeyedProcessFunction, schema: pa.Schema | None = None
    ) -> None:
        super().__init__(name)
        self.key = key
        self.fn = fn
        self.schema = schema
        self.watermark = MIN_WATERMARK
        self.backend: KeyedStateBackend
        self._next_proc: int | None = _UNKNOWN

    def setup(self, ctx: OperatorContext, output: Collector) -> None:
        super().setup(ctx, output)
        self.backend = ctx.create_keyed_backend(self.name)
        self._kctx = _KeyedCtx(self)

    def initialize_state(self, keyed: list[dict[str, Any]], operator_states: list[Any]) -> None:
        if keyed:
            self.backend.restore(keyed)
            for name, count in self.backend.restore_metrics().items():
                self.ctx.metric(name, count)

    def open(self) -> None:
        self._call(self.fn.open, self._kctx)

    def _set_key(self, key: Any, kg: int, key_bytes: bytes | None = None) -> None:
        if key_bytes is None:
            try:
                key_bytes = encode_key(key)
            except ConfigError as exc:
                raise ConfigError(f"{self.name}: {exc}") from None
        self.backend.set_current_key(key, kg, key_bytes)

    def timer(self, domain: TimeDomain, timestamp: int, register: bool) -> None:
        """Register or delete a timer of the current key."""
        be = self.backend
        if register:
            be.timers.register(domain, timestamp, be.current_key_group, be.current_key_bytes)
            if domain is TimeDomain.PROCESSING and self._next_proc != _UNKNOWN:
                self._next_proc = timestamp if self._next_proc is None else min(self._next_proc, timestamp)
        else:
            be.timers.delete(domain, timestamp, be.current_key_group, be.current_key_bytes)
            if domain is TimeDomain.PROCESSING:
                self._next_proc = _UNKNOWN

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

    def _fire(self, domain: TimeDomain, upto: int) -> None:
        timers = self.backend.timers
        if domain is TimeDomain.PROCESSING:
            self._next_proc = _UNKNOWN
        # timers registered while firing that are due already fire in the same round (as in Flink)
        while due := timers.pop_due(domain, upto):
            for t in due:
                self._set_key(decode_key(t.key), t.key_group, t.key)
                self._kctx.timestamp = t.timestamp
                self._emit(self._call(self.fn.on_timer, t.timestamp, self.backend.current_key, self._kctx))
        self._kctx.timestamp = None

    def process_watermark(self, timestamp: int) -> None:
        self.watermark = timestamp
        self._fire(TimeDomain.EVENT, timestamp)
        self.output.emit_watermark(timestamp)

    def on_processing_time(self, now_ms: int) -> None:
        self._fire(TimeDomain.PROCESSING, now_ms)

    def next_timer_ms(self) -> int | None:
        if self._next_proc == _UNKNOWN:
            self._next_proc = self.backend.timers.next_timestamp(TimeDomain.PROCESSING)
        return self._next_proc

    def snapshot_state(self, checkpoint_id: int, savepoint: bool = False) -> OperatorSnapshot:
        return OperatorSnapshot(keyed=self.backend.snapshot(checkpoint_id, savepoint))

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.backend.notify_checkpoint_complete(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self.backend.notify_checkpoint_aborted(checkpoint_id)

    def close(self) -> None:
        try:
            self._call(self.fn.close)
        finally:
            self.backend.dispose()


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
