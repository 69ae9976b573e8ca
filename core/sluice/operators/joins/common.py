"""What both joins share: the output columns (left, then right's non-key columns, renamed on a clash)."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

__all__ = ["joined", "right_names"]


def right_names(left: Sequence[str], right: Sequence[str], skip: Sequence[str], suffix: str) -> dict[str, str]:
    """The right columns that go into the output (not in ``skip``), each with its output name: ``suffix``
    appended where the left side has a column of that name."""
    taken = set(left)
    return {c: (c + suffix if c in taken else c) for c in right if c not in skip}


def joined(left: pa.RecordBatch | pa.Table, right_cols: dict[str, pa.Array], schema: pa.Schema) -> pa.RecordBatch:
    """``left``'s columns and ``right_cols`` (output name -> array) as one batch of ``schema``."""
    arrays = [left.column(i) for i in range(left.num_columns)] + list(right_cols.values())
    arrays = [a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a for a in arrays]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
