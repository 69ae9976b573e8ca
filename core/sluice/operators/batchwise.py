"""Helpers of the vectorized keyed operators (deduplication, joins): a batch's distinct keys, event time as
int64 milliseconds, and Arrow buffers kept per key group in operator state.

Every helper works on whole Arrow arrays or NumPy vectors: no Python call per record.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from sluice.errors import ConfigError
from sluice.state.keygroups import KeyGroupRange, hash_columns, key_groups

__all__ = ["ArrowBuffer", "event_ms"]


def event_ms(column: pa.Array | pa.ChunkedArray, option: str) -> np.ndarray:
    """An event-time column as int64 milliseconds since the epoch (int columns are taken as milliseconds)."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if arr.null_count:
        raise ConfigError(f"{option}: the event-time column has nulls; every record needs a timestamp")
    if pa.types.is_timestamp(arr.type):
        arr = arr.cast(pa.timestamp("ms", arr.type.tz)).cast(pa.int64())
    elif pa.types.is_date(arr.type):
        arr = arr.cast(pa.timestamp("ms")).cast(pa.int64())
    elif not pa.types.is_integer(arr.type):
        raise ConfigError(
            f"{option}: the event-time column must be a timestamp or integer milliseconds, not {arr.type}"
        )
    return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=np.int64)


class ArrowBuffer:
    """Rows held until the watermark releases them, as Arrow record batches; checkpointed whole as Arrow
    IPC in the operator's state (``operator_state_distribution = "union"``: on restore every subtask reads
    every old buffer and keeps the rows of the key groups it owns)."""

    def __init__(self, key_columns: Sequence[str]) -> None:
        self.key_columns = list(key_columns)
        self.schema: pa.Schema | None = None
        self._batches: list[pa.RecordBatch] = []
        self._table: pa.Table | None = None

    def __len__(self) -> int:
        return sum(b.num_rows for b in self._batches)

    def add(self, batch: pa.RecordBatch) -> None:
        """Hold ``batch``'s rows."""
        if not batch.num_rows:
            return
        if self.schema is None:
            self.schema = batch.schema
        self._batches.append(batch)
        self._table = None

    def table(self) -> pa.Table:
        """Every held row."""
        if self._table is None:
            if self.schema is None:
                return pa.table({})
            self._table = pa.Table.from_batches(self._batches, self.schema).combine_chunks()
            self._batches = self._table.to_batches()
        return self._table

    def keep(self, mask: np.ndarray) -> None:
        """Keep only the rows where ``mask`` (over :meth:`table`'s rows) holds."""
        if self.schema is None or mask.all():
            return
        kept = self.table().filter(pa.array(mask))
        self._batches = kept.to_batches()
        self._table = kept

    def snapshot(self) -> bytes | None:
        """The rows as Arrow IPC (None when empty)."""
        table = self.table()
        if self.schema is None or not table.num_rows:
            return None
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
        return bytes(sink.getvalue().to_pybytes())

    def restore(self, blobs: Sequence[Any], owned: KeyGroupRange, max_parallelism: int) -> None:
        """Load the rows of the key groups ``owned`` out of the old subtasks' snapshots."""
        for blob in blobs:
            if not blob:
                continue
            table = pa.ipc.open_stream(pa.py_buffer(blob)).read_all()
            if not table.num_rows:
                continue
            cols = [table.column(c).combine_chunks() for c in self.key_columns]
            kgs = key_groups(hash_columns(cols), max_parallelism)
            mine = (kgs >= owned.start) & (kgs < owned.end)
            for b in table.filter(pa.array(mine)).to_batches():
                self.add(b)
