"""Stateless operators: pass-through (union, exchanges), map_batches, filter, and the per-record map and
flat_map (convenient and slow: a Python call per record)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sluice.errors import ConfigError
from sluice.operators.base import Operator, to_batches

__all__ = ["FilterOperator", "FlatMapOperator", "MapBatchesOperator", "MapOperator", "PassThroughOperator"]


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
