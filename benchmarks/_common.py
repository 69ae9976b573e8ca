"""Helpers shared by the benchmark scripts."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from sluice.sink import Sink, SinkWriter

__all__ = ["CountSink"]


class CountSink(Sink[int]):
    """Counts rows and commits nothing: isolates engine cost from I/O."""

    name = "count"

    def create_writer(self, ctx: Any, restored: list[Any]) -> SinkWriter[int]:
        return _CountWriter()


class _CountWriter(SinkWriter[int]):
    def __init__(self) -> None:
        self.rows = 0

    def write(self, batch: pa.RecordBatch) -> None:
        self.rows += batch.num_rows

    def prepare_commit(self, checkpoint_id: int) -> list[int]:
        return []
