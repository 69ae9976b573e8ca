"""Deterministic inputs of the deduplication and join tests, and references computed over the whole input
in pure Python (independent of the operators: record by record, in each key's arrival order)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pyarrow as pa

T0 = 1_600_000_000_000

Rows = Callable[[int, int, int], pa.RecordBatch]

EVENTS = pa.schema([("id", pa.int64()), ("k", pa.int64()), ("ts", pa.int64()), ("ord", pa.int64())])
FACTS = pa.schema([("id", pa.int64()), ("cust", pa.int64()), ("ts", pa.int64()), ("amount", pa.int64())])
DIMS = pa.schema([("cust", pa.int64()), ("ts", pa.int64()), ("tier", pa.string()), ("level", pa.int64())])


def events(per_split: int, period: int, step: int = 10) -> Rows:
    """Rows of key ``split * 1000 + (7 * seq) % period``: every key recurs every ``period`` rows of its split,
    so a horizon of ``within`` ms holds about ``within / (period * step)`` of its records."""

    def rows(split: int, start: int, end: int) -> pa.RecordBatch:
        seq = np.arange(start, end, dtype=np.int64)
        return pa.RecordBatch.from_arrays(
            [pa.array(split * per_split + seq), pa.array(split * 1000 + (7 * seq) % period),
             pa.array(T0 + seq * step), pa.array((seq * 31 + split) % 17)],
            schema=EVENTS,
        )  # fmt: skip

    return rows


def facts(per_split: int, customers: int, step: int = 10, offset: int = 0) -> Rows:
    """Fact rows: customer ``(3 * seq + split) % customers``, time ``T0 + offset + seq * step``."""

    def rows(split: int, start: int, end: int) -> pa.RecordBatch:
        seq = np.arange(start, end, dtype=np.int64)
        return pa.RecordBatch.from_arrays(
            [pa.array(10**6 + split * per_split + seq), pa.array((3 * seq + split) % customers),
             pa.array(T0 + offset + seq * step), pa.array(seq * 13 % 100)],
            schema=FACTS,
        )  # fmt: skip

    return rows


def dims(splits: int, customers: int, step: int = 25, offset: int = -100) -> Rows:
    """Dimension rows: a customer's rows all come from split ``customer % splits``, in time order; every 7th
    is a tombstone (its non-key columns other than the time null)."""
    per = max(1, customers // splits)

    def rows(split: int, start: int, end: int) -> pa.RecordBatch:
        seq = np.arange(start, end, dtype=np.int64)
        dead = seq % 7 == 6
        return pa.RecordBatch.from_arrays(
            [pa.array((seq % per) * splits + split), pa.array(T0 + offset + seq * step),
             pa.array([f"tier{s % 3}" for s in seq.tolist()], mask=dead), pa.array(seq, mask=dead)],
            schema=DIMS,
        )  # fmt: skip

    return rows


def table_rows(rows: Rows, splits: int, per_split: int) -> list[dict[str, Any]]:
    """Every row a generator with ``rows`` emits, split after split (each split in order)."""
    return [r for s in range(splits) for r in rows(s, 0, per_split).to_pylist()]


def dedup_reference(records: Iterable[dict[str, Any]], within: int, keep: str = "first") -> list[dict[str, Any]]:
    """The deduplication's output, record by record in each key's order (docs/dedup_joins.md)."""
    start: dict[Any, int] = {}
    best: dict[Any, dict[str, Any]] = {}
    out = []
    for r in records:
        k = r["k"]
        if k in start and r["ts"] - start[k] < within:
            if keep == "last" and r["ord"] >= best[k]["ord"]:
                best[k] = r
            continue
        if keep == "first":
            out.append(r)
        elif k in best:
            out.append(best[k])
        start[k], best[k] = r["ts"], r
    return out + (list(best.values()) if keep == "last" else [])


def latest_reference(fact_rows: list[dict[str, Any]], dim_rows: list[dict[str, Any]], how: str) -> list[dict[str, Any]]:
    """Each fact with the latest dimension row of its customer at or before the fact's time."""
    versions: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for d in sorted(dim_rows, key=lambda d: d["ts"]):
        versions[d["cust"]].append(d)
    out = []
    for f in fact_rows:
        live = [d for d in versions[f["cust"]] if d["ts"] <= f["ts"]]
        row = live[-1] if live else None
        if row is not None and row["tier"] is None and row["level"] is None:
            row = None  # a tombstone
        if row is None and how == "inner":
            continue
        out.append({**f, "ts_right": row and row["ts"], "tier": row and row["tier"], "level": row and row["level"]})
    return out


def interval_reference(left: list[dict[str, Any]], right: list[dict[str, Any]], lower: int, upper: int) -> list[dict[str, Any]]:
    """Every pair of the same key with ``left.ts + lower <= right.ts <= left.ts + upper`` (Flink's
    ``left.intervalJoin(right).between(lower, upper)``)."""
    by_key: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in right:
        by_key[r["cust"]].append(r)
    return [
        {**a, "id_right": b["id"], "ts_right": b["ts"], "amount_right": b["amount"]}
        for a in left
        for b in by_key[a["cust"]]
        if lower <= b["ts"] - a["ts"] <= upper
    ]


def as_rows(dicts: Iterable[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Rows as the fault suite compares them (tests/faults/shapes.py ``rows_of``): sorted tuples of the
    values in column-name order."""
    return sorted(tuple(d[c] for c in sorted(d)) for d in dicts)
