"""Window assignment, vectorized: the windows of each row (tumbling: one, sliding: ``size / slide``,
session: ``[t, t + gap)`` before merging), and the merging of session windows that overlap."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice.operators.windows.spec import Session, Sliding, Tumbling, WindowAssigner

__all__ = ["assign", "merge_sessions"]


def assign(assigner: WindowAssigner, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(row, start, end)`` per window assignment of event times ``t`` (int64 ms)."""
    rows = np.arange(len(t), dtype=np.int64)
    if isinstance(assigner, Tumbling):
        start = t - np.mod(t - assigner.offset, assigner.size)
        return rows, start, start + assigner.size
    if isinstance(assigner, Sliding):
        n = assigner.size // assigner.slide
        last = t - np.mod(t - assigner.offset, assigner.slide)
        rows = np.repeat(rows, n)
        start = np.repeat(last, n) - np.tile(np.arange(n, dtype=np.int64) * assigner.slide, len(t))
        return rows, start, start + assigner.size
    assert isinstance(assigner, Session)
    return rows, t.copy(), t + assigner.gap


def _key_changes(table: pa.Table, keys: list[str]) -> np.ndarray:
    """Per row of a table sorted by ``keys``: whether its key differs from the previous row's (row 0: True)."""
    n = table.num_rows
    change = np.zeros(n, bool)
    if n:
        change[0] = True
    for k in keys:
        col = table.column(k).combine_chunks()
        a, b = col.slice(1), col.slice(0, n - 1)
        same = pc.or_kleene(pc.equal(a, b), pc.and_(pc.is_null(a), pc.is_null(b)))
        change[1:] |= ~pc.fill_null(same, False).to_numpy(zero_copy_only=False)
    return change


def merge_sessions(table: pa.Table, nkeys: int) -> pa.Table:
    """Give each row of a session partial table the bounds of the session it belongs to: per key, windows
    that overlap or touch (``start <= end`` of an earlier one, as Flink merges) become one
    ``[min start, max end)``."""
    if not table.num_rows:
        return table
    keys = [f"__k{i}" for i in range(nkeys)]
    order = pc.sort_indices(table, [*((k, "ascending") for k in keys), ("__ws", "ascending")])
    s = table.take(order)
    ws = s.column("__ws").to_numpy()
    we = s.column("__we").to_numpy()
    key_id = np.cumsum(_key_changes(s, keys)) - 1
    base = int(we.min())
    span = int(we.max()) - base + 1
    if key_id[-1] * span < 2**62:  # a running maximum of the end per key, in one pass
        shifted = key_id * span + (we - base)
        run = np.maximum.accumulate(shifted) - key_id * span + base
    else:  # pragma: no cover - keys x time span beyond int64
        run = we.copy()
        for j in range(1, len(we)):
            if key_id[j] == key_id[j - 1]:
                run[j] = max(run[j - 1], we[j])
    new = np.ones(len(ws), bool)
    new[1:] = (key_id[1:] != key_id[:-1]) | (ws[1:] > run[:-1])
    sid = np.cumsum(new) - 1
    starts = ws[new]
    ends = np.maximum.reduceat(we, np.flatnonzero(new))
    return s.set_column(s.schema.get_field_index("__ws"), "__ws", pa.array(starts[sid])).set_column(
        s.schema.get_field_index("__we"), "__we", pa.array(ends[sid])
    )
