"""Vectorized window aggregation: a batch's rows become *partial aggregates* per (key, window) with one
``pyarrow`` ``group_by``; partials (of batches, of checkpointed segments) merge with another; a fired
window's partials become its result row.

A partial table has the group columns ``__k0..`` (the key columns), ``__ws`` / ``__we`` (window start and
end, ms), per aggregation ``i`` the columns ``__p{i}a`` (and ``__p{i}b``), ``__tmin`` / ``__tmax`` when a
``first`` / ``last`` needs them, ``__dirty`` (changed since it last fired) and ``__fires`` (times fired).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice.operators.windows.spec import Agg

__all__ = ["finalize", "group_columns", "merge", "partial"]

_ALL = pc.CountOptions(mode="all")
_KEEP_NULLS = pc.ScalarAggregateOptions(skip_nulls=False)
_ORDERED = ("first", "last")
_LISTS = ("count_distinct", "agg")


def group_columns(nkeys: int) -> list[str]:
    """The group columns of a partial table with ``nkeys`` key columns."""
    return [f"__k{i}" for i in range(nkeys)] + ["__ws", "__we"]


def _rename(t: pa.Table, names: dict[str, str]) -> pa.Table:
    return t.rename_columns([names.get(n, n) for n in t.column_names])


def partial(rows: pa.Table, nkeys: int, aggs: tuple[Agg, ...]) -> pa.Table:
    """The partials of raw rows: ``rows`` has the group columns, ``__t`` (event time, ms) and ``__v{i}``
    (aggregation ``i``'s input column; any column for ``count()``)."""
    if any(a.fn in _ORDERED for a in aggs):
        rows = rows.take(pc.sort_indices(rows, [("__t", "ascending")]))  # stable: ties keep arrival order
    ops: list[tuple[Any, ...]] = []
    names: dict[str, str] = {}
    for i, a in enumerate(aggs):
        v = f"__v{i}"
        if a.fn == "count":
            ops.append((v, "count", _ALL if a.column is None else pc.CountOptions(mode="only_valid")))
            names[f"{v}_count"] = f"__p{i}a"
        elif a.fn in ("sum", "min", "max"):
            ops.append((v, a.fn))
            names[f"{v}_{a.fn}"] = f"__p{i}a"
        elif a.fn == "mean":
            ops += [(v, "sum"), (v, "count")]
            names.update({f"{v}_sum": f"__p{i}a", f"{v}_count": f"__p{i}b"})
        elif a.fn in _ORDERED:
            ops.append((v, a.fn, _KEEP_NULLS))
            names[f"{v}_{a.fn}"] = f"__p{i}a"
        elif a.fn == "count_distinct":
            ops.append((v, "distinct"))
            names[f"{v}_distinct"] = f"__p{i}a"
        else:
            ops.append((v, "list"))
            names[f"{v}_list"] = f"__p{i}a"
    if any(a.fn == "first" for a in aggs):
        ops.append(("__t", "min"))
        names["__t_min"] = "__tmin"
    if any(a.fn == "last" for a in aggs):
        ops.append(("__t", "max"))
        names["__t_max"] = "__tmax"
    keys = group_columns(nkeys)
    out = _rename(rows.group_by(keys, use_threads=False).aggregate(ops), names)
    n = out.num_rows
    out = out.append_column("__dirty", pa.array(np.ones(n, np.int8))).append_column(
        "__fires", pa.array(np.zeros(n, np.int64))
    )
    return out.select([*keys, *(c for c in out.column_names if c not in keys)])


def _merge_ops(aggs: tuple[Agg, ...], table: pa.Table) -> tuple[list[tuple[Any, ...]], dict[str, str]]:
    """The ``group_by`` operations that merge the order-free partials, and their output names."""
    ops: list[tuple[Any, ...]] = [("__dirty", "max"), ("__fires", "max")]
    names = {"__dirty_max": "__dirty", "__fires_max": "__fires"}
    for i, a in enumerate(aggs):
        if a.fn in ("count", "sum", "mean"):
            ops.append((f"__p{i}a", "sum"))
            names[f"__p{i}a_sum"] = f"__p{i}a"
            if a.fn == "mean":
                ops.append((f"__p{i}b", "sum"))
                names[f"__p{i}b_sum"] = f"__p{i}b"
        elif a.fn in ("min", "max"):
            ops.append((f"__p{i}a", a.fn))
            names[f"__p{i}a_{a.fn}"] = f"__p{i}a"
    return ops, names


def merge(table: pa.Table, nkeys: int, aggs: tuple[Agg, ...]) -> pa.Table:
    """Merge partials of the same (key, window): rows of ``table`` in arrival order (older first)."""
    keys = group_columns(nkeys)
    ops, names = _merge_ops(aggs, table)
    if not any(a.fn in _ORDERED or a.fn in _LISTS for a in aggs):
        return _rename(table.group_by(keys, use_threads=False).aggregate(ops), names).select(
            table.column_names
        )
    # a group id per row (groups in order of first appearance), so that differently ordered passes align
    idx = table.append_column("__i", pa.array(np.arange(table.num_rows, dtype=np.int64)))
    groups = idx.group_by(keys, use_threads=False).aggregate([("__i", "list")])
    lists = groups.column("__i_list").combine_chunks()
    gid = np.empty(table.num_rows, np.int64)
    gid[pc.list_flatten(lists).to_numpy()] = pc.list_parent_indices(lists).to_numpy()
    ng = groups.num_rows
    t = table.append_column("__gid", pa.array(gid))
    cols: dict[str, pa.Array | pa.ChunkedArray] = {k: groups.column(k) for k in keys}
    base = _rename(t.group_by("__gid", use_threads=False).aggregate(ops), names)
    base = base.take(pc.sort_indices(base.column("__gid")))  # by group id: aligned with ``groups``
    for c in base.column_names:
        if c != "__gid":
            cols[c] = base.column(c)
    for fn, tcol, op in (("first", "__tmin", "min"), ("last", "__tmax", "max")):
        mine = [i for i, a in enumerate(aggs) if a.fn == fn]
        if not mine:
            continue
        s = t.take(pc.sort_indices(t, [("__gid", "ascending"), (tcol, "ascending")]))
        got = s.group_by("__gid", use_threads=False).aggregate(
            [*((f"__p{i}a", fn, _KEEP_NULLS) for i in mine), (tcol, op)]
        )
        for i in mine:
            cols[f"__p{i}a"] = got.column(f"__p{i}a_{fn}")
        cols[tcol] = got.column(f"{tcol}_{op}")
    for i, a in enumerate(aggs):
        if a.fn not in _LISTS:
            continue
        col = t.column(f"__p{i}a").combine_chunks()
        flat = pa.table(
            {"__gid": pc.take(t.column("__gid"), pc.list_parent_indices(col)), "v": pc.list_flatten(col)}
        )
        got = flat.group_by("__gid", use_threads=False).aggregate(
            [("v", "distinct" if a.fn == "count_distinct" else "list")]
        )
        where = np.full(ng, -1, np.int64)
        where[got.column("__gid").to_numpy()] = np.arange(got.num_rows)
        cols[f"__p{i}a"] = pc.take(got.column(1), pa.array(where, mask=where < 0))
    return pa.table({c: cols[c] for c in table.column_names})


def finalize(
    merged: pa.Table, key_names: list[str], aggs: tuple[Agg, ...], time_type: pa.DataType, revision: bool
) -> pa.Table:
    """The result rows of fired windows: key columns, ``window_start``, ``window_end``, one column per
    aggregation (and ``revision`` when updates may follow)."""
    cols: dict[str, Any] = {name: merged.column(f"__k{i}") for i, name in enumerate(key_names)}
    for src, dst in (("__ws", "window_start"), ("__we", "window_end")):
        col = merged.column(src)
        cols[dst] = (
            col if pa.types.is_integer(time_type) else pc.cast(col, pa.timestamp("ms")).cast(time_type)
        )
    for i, a in enumerate(aggs):
        p = merged.column(f"__p{i}a")
        if a.fn == "count":
            cols[a.name] = pc.fill_null(p, 0)
        elif a.fn == "mean":
            b = merged.column(f"__p{i}b")
            cols[a.name] = pc.divide(
                pc.cast(p, pa.float64()), pc.if_else(pc.equal(b, 0), None, pc.cast(b, pa.float64()))
            )
        elif a.fn == "count_distinct":
            cols[a.name] = pc.fill_null(pc.list_value_length(p), 0).cast(pa.int64())
        elif a.fn == "agg":
            assert a.udf is not None
            values = p.combine_chunks() if isinstance(p, pa.ChunkedArray) else p
            cols[a.name] = pa.array([a.udf(values[j].values) for j in range(len(values))], type=a.type)
        else:
            cols[a.name] = p
    if revision:
        cols["revision"] = merged.column("__fires")
    return pa.table(cols)
