"""User function interfaces for keyed processing: KeyedProcessFunction, its context and timers."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, TypeAlias

import pyarrow as pa

from sluice.state.api import StateDescriptor

__all__ = ["KeyedContext", "KeyedProcessFunction", "Output", "RuntimeContext", "TimerService"]

#: What process/on_timer may return: nothing, a batch, a table, a list of row dicts, or batches.
Output: TypeAlias = pa.RecordBatch | pa.Table | Iterable[dict[str, Any]] | Iterable[pa.RecordBatch] | None


class TimerService(Protocol):
    """Timers of the current key. Timestamps are milliseconds; event time follows the watermark."""

    def current_processing_time(self) -> int: ...
    def current_watermark(self) -> int: ...
    def register_event_time_timer(self, timestamp: int) -> None: ...
    def register_processing_time_timer(self, timestamp: int) -> None: ...
    def delete_event_time_timer(self, timestamp: int) -> None: ...
    def delete_processing_time_timer(self, timestamp: int) -> None: ...


class RuntimeContext(Protocol):
    """What a function sees of its subtask at ``open``."""

    @property
    def subtask(self) -> int: ...
    @property
    def parallelism(self) -> int: ...
    @property
    def operator_name(self) -> str: ...
    def state(self, descriptor: StateDescriptor) -> Any:
        """The handle for keyed state ``descriptor`` (value, list or map state), scoped to the current key."""


class KeyedContext(RuntimeContext, Protocol):
    """Context of one ``process``/``on_timer`` call: the current key and its timers."""

    @property
    def key(self) -> Any: ...
    @property
    def timer_service(self) -> TimerService: ...
    @property
    def timestamp(self) -> int | None:
        """For on_timer: the timer's timestamp."""


class KeyedProcessFunction:
    """Stateful processing per key. Subclass and override :meth:`process` (and :meth:`on_timer`).

    ``process`` is called once per distinct key in each batch with that key's rows (in arrival order), so
    it stays vectorized within a key. State handles from ``ctx.state(...)`` read and write the current key.
    """

    def open(self, ctx: RuntimeContext) -> None:
        """Called once per subtask before any input."""

    def process(self, key: Any, rows: pa.RecordBatch, ctx: KeyedContext) -> Output:
        raise NotImplementedError

    def on_timer(self, timestamp: int, key: Any, ctx: KeyedContext) -> Output:
        """A timer of ``key`` fired."""
        return None

    def close(self) -> None:
        """Called once when the subtask ends."""
