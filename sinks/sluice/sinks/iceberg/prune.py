"""Which data files of an Iceberg table may hold the keys a checkpoint's changes touch.

Two tests, both from the manifests (no data file is opened), both conservative (a file they keep may still
hold none of the keys; one they drop holds none):

- **partition values**: for partition fields whose source column is a key column (``identity(key)``,
  ``bucket(n, key)``, ``truncate(w, key)``), a file whose partition values no changed key maps to is
  dropped. Partition fields over other columns cannot prune: an update may move a row between their
  partitions, and a delete names only the key.
- **key bounds**: a file is dropped if, for some key column, no changed key's value lies within the file's
  lower and upper bound of that column (the bounds of a truncated string are still bounds). Integer-like
  keys are tested for every file at once (``numpy.searchsorted``), others with a binary search per file.

Bucketing or partitioning the table by the key makes the first test exact; files written sorted by key
(the merge writes them so) keep the second one tight.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from pyiceberg.table import FileScanTask, Table

__all__ = ["internal_values", "touched_files"]


def internal_values(values: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """``values`` in Iceberg's internal representation, as manifest bounds and partition values hold them:
    dates as days, times and timestamps as microseconds (int64); other types unchanged."""
    t = values.type
    if pa.types.is_date32(t):
        return values.cast(pa.int32())
    if pa.types.is_date64(t):
        return values.cast(pa.date32()).cast(pa.int32())
    if pa.types.is_timestamp(t):
        return pc.cast(values, pa.timestamp("us", tz=t.tz), safe=False).cast(pa.int64())
    if pa.types.is_time(t):
        return pc.cast(values, pa.time64("us"), safe=False).cast(pa.int64())
    if pa.types.is_dictionary(t):
        return internal_values(values.cast(t.value_type))
    return values


def touched_files(table: Table, tasks: Sequence[FileScanTask], keys: pa.Table) -> list[FileScanTask]:
    """The tasks whose data file may hold a row with one of the keys in ``keys`` (a table of the key
    columns, any number of rows)."""
    if keys.num_rows == 0:
        return []
    schema = table.schema()
    candidates = [t for t in tasks if t.file.record_count > 0]
    candidates = _by_partition(table, candidates, keys)
    for name in keys.column_names:
        if not candidates:
            break
        field = schema.find_field(name)
        candidates = _by_bounds(candidates, field.field_id, field.field_type, keys.column(name))
    return candidates


def _by_partition(table: Table, tasks: list[FileScanTask], keys: pa.Table) -> list[FileScanTask]:
    schema = table.schema()
    specs = table.specs()
    wanted: dict[int, tuple[list[int], set[tuple[Any, ...]]] | None] = {}
    out = []
    for task in tasks:
        spec_id = task.file.spec_id
        if spec_id not in wanted:
            wanted[spec_id] = _partition_values(specs[spec_id], schema, keys)
        w = wanted[spec_id]
        if w is None or tuple(task.file.partition[i] for i in w[0]) in w[1]:
            out.append(task)
    return out


def _partition_values(
    spec: Any, schema: Any, keys: pa.Table
) -> tuple[list[int], set[tuple[Any, ...]]] | None:
    """The positions of ``spec``'s fields over key columns and the partition tuples the keys map to there
    (None if no field of the spec is over a key column, or a transform cannot be evaluated in Arrow)."""
    positions, columns = [], []
    for i, f in enumerate(spec.fields):
        name = schema.find_column_name(f.source_id)
        if name not in keys.column_names:
            continue
        try:
            values = f.transform.pyarrow_transform(schema.find_type(f.source_id))(keys.column(name))
        except Exception:  # a transform pyiceberg cannot run in Arrow (or without pyiceberg-core): no pruning
            return None
        positions.append(i)
        columns.append(internal_values(values))
    if not positions:
        return None
    names = [f"p{i}" for i in range(len(columns))]
    distinct = pa.table(columns, names=names).group_by(names).aggregate([])
    rows = zip(*(distinct.column(n).to_pylist() for n in names), strict=True)
    return positions, set(rows)


def _by_bounds(
    tasks: list[FileScanTask], field_id: int, field_type: Any, values: pa.Array | pa.ChunkedArray
) -> list[FileScanTask]:
    from pyiceberg.conversions import from_bytes

    distinct = pc.unique(internal_values(values))
    distinct = distinct.filter(pc.invert(pc.is_null(distinct)))
    kept: list[FileScanTask] = []
    bounded: list[tuple[FileScanTask, Any, Any]] = []
    for task in tasks:
        lo = (task.file.lower_bounds or {}).get(field_id)
        hi = (task.file.upper_bounds or {}).get(field_id)
        if lo is None or hi is None:
            kept.append(task)  # no statistics: the file may hold anything
        else:
            bounded.append((task, from_bytes(field_type, lo), from_bytes(field_type, hi)))
    if not bounded:
        return kept
    inside = {id(t) for t in kept}
    if pa.types.is_integer(distinct.type):
        dtype = np.uint64 if pa.types.is_uint64(distinct.type) else np.int64
        sorted_values = np.sort(distinct.to_numpy(zero_copy_only=False).astype(dtype))
        lows = np.array([b[1] for b in bounded], dtype=dtype)
        highs = np.array([b[2] for b in bounded], dtype=dtype)
        hits = np.searchsorted(sorted_values, highs, side="right") > np.searchsorted(
            sorted_values, lows, side="left"
        )
        inside |= {id(b[0]) for b, hit in zip(bounded, hits.tolist(), strict=True) if hit}
    else:
        ordered = sorted(distinct.to_pylist())
        for task, lo, hi in bounded:
            try:
                if bisect.bisect_right(ordered, hi) > bisect.bisect_left(ordered, lo):
                    inside.add(id(task))
            except TypeError:  # bounds of a type the key values do not compare with: keep the file
                inside.add(id(task))
    return [t for t in tasks if id(t) in inside]
