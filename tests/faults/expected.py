"""The fault shapes' expected output, computed from their input in plain Python (no sluice run, no Arrow).

The judge of every crash, stop and rescale scenario of the shapes in tests/faults/shapes.py: each shape's
transformation written again over the rows its generators read, as a reader of the shape's code understands
it. A failure-free run of each shape is checked against it too (tests/faults/test_exactly_once.py ``hits``),
so "0 lost, 0 duplicated" is relative to the input, not to another run of the engine.

The generator's rows (connectors/sluice/connectors/generator.py, documented there): row ``seq`` of split
``s`` has ``id = s * per_split + seq``, ``key = id % 50``, ``value = id * 7 % 1000``, ``ts = 1.6e12 + 10 *
seq`` (the shapes' ``num_keys`` 50 and ``step_ms`` 10), then the shape's ``offset`` is added to ``id``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from tests.faults.shapes import Input

Row = dict[str, int]

__all__ = ["expected_rows", "input_rows"]


def input_rows(gen: Input) -> Iterator[Row]:
    """The rows ``gen`` reads, split by split, each split in ``seq`` order."""
    for split in range(gen.splits):
        for seq in range(gen.per_split):
            base = split * gen.per_split + seq
            yield {
                "id": base + gen.offset,
                "split": split,
                "seq": seq,
                "key": base % 50,
                "value": base * 7 % 1000,
                "ts": 1_600_000_000_000 + seq * 10,
            }


def _k(row: Row) -> int:
    """``with_key``: a key whose rows all come from one split (so their order is the split's)."""
    return row["split"] * 100 + (row["seq"] & 7)


def _running(rows: list[Row]) -> list[Row]:
    """``RunningCount`` per ``k``, rows in their input order: each row's running count and sum of ``value``."""
    count: dict[int, int] = {}
    total: dict[int, int] = {}
    out = []
    for r in rows:
        k = r["k"]
        count[k] = count.get(k, 0) + 1
        total[k] = total.get(k, 0) + r["value"]
        out.append({"id": r["id"], "k": k, "count": count[k], "sum": total[k]})
    return out


def _chain(inputs: list[list[Row]]) -> list[Row]:
    return [{**r, "double": r["value"] * 2} for r in inputs[0] if r["value"] >= 0]


def _keyed(inputs: list[list[Row]]) -> list[Row]:
    return _running([{**r, "k": _k(r)} for r in inputs[0]])


def _union(inputs: list[list[Row]]) -> list[Row]:
    a = [{**r, "k": _k(r)} for r in inputs[0]]
    b = [{**r, "k": _k(r) + 10**6} for r in inputs[1]]  # gen-b's ids carry its 10**9 offset already
    return _running(a + b)  # the two key ranges are disjoint: per key, one input's order


def _rebalance(inputs: list[list[Row]]) -> list[Row]:
    return [{"id": r["id"], "value": r["value"]} for r in inputs[0]]


def _two_keyed(inputs: list[list[Row]]) -> list[Row]:
    first = _running([{**r, "k": _k(r)} for r in inputs[0]])
    return _running([{**r, "value": r["count"]} for r in first])


TRANSFORMS: dict[str, Callable[[list[list[Row]]], list[Row]]] = {
    "chain": _chain,
    "keyed": _keyed,
    "union": _union,
    "rebalance": _rebalance,
    "two_keyed": _two_keyed,
}


def expected_rows(shape: str, inputs: list[Input]) -> tuple[tuple[Any, ...], ...]:
    """What ``shape`` must commit over ``inputs``, as :func:`tests.faults.shapes.rows_of` gives committed rows:
    each row's values in sorted column order, the rows sorted."""
    rows = TRANSFORMS[shape]([list(input_rows(g)) for g in inputs])
    return tuple(sorted(tuple(r[c] for c in sorted(r)) for r in rows))
