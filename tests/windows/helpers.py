"""Helpers of the window tests: a collector that records what an operator emits, an operator run outside a
job, and DuckDB references computed over a whole input."""

from __future__ import annotations

from typing import Any

import duckdb
import pyarrow as pa
from sluice.keys import KeySelector
from sluice.operators.base import OperatorContext
from sluice.operators.windows.operator import WindowOperator
from sluice.operators.windows.spec import Agg, WindowAssigner
from sluice.state.keygroups import KeyGroupRange


class Collected:
    """What an operator emitted: result batches, side outputs by tag, watermarks."""

    def __init__(self) -> None:
        self.batches: list[pa.RecordBatch] = []
        self.side: dict[str, list[pa.RecordBatch]] = {}
        self.watermarks: list[int] = []

    def emit(self, batch: pa.RecordBatch) -> None:
        self.batches.append(batch)

    def emit_side(self, tag: str, batch: pa.RecordBatch) -> None:
        self.side.setdefault(tag, []).append(batch)

    def emit_watermark(self, timestamp: int) -> None:
        self.watermarks.append(timestamp)

    def has_side(self, tag: str) -> bool:
        return True

    def rows(self) -> list[dict[str, Any]]:
        """The results so far (and forget them)."""
        out = [r for b in self.batches for r in b.to_pylist()]
        self.batches.clear()
        return out

    def side_rows(self, tag: str = "late") -> list[dict[str, Any]]:
        return [r for b in self.side.get(tag, []) for r in b.to_pylist()]


def operator(
    assigner: WindowAssigner,
    aggs: tuple[Agg, ...],
    key: Any = "k",
    time: str | None = "t",
    lateness: int = 0,
    **kw: Any,
) -> tuple[WindowOperator, Collected]:
    """A window operator set up as one subtask owning every key group (hashmap backend)."""
    op = WindowOperator("w", KeySelector(key), assigner, aggs, time, lateness, **kw)
    out = Collected()
    op.setup(OperatorContext("w", 0, 1, 16, KeyGroupRange(0, 16), "job", 0), out)
    op.open()
    return op, out


def batch(**cols: list[Any]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({k: pa.array(v, pa.int64()) for k, v in cols.items()})


def sql(query: str, **tables: pa.Table) -> list[dict[str, Any]]:
    """Rows of a DuckDB query over Arrow tables (named by keyword)."""
    con = duckdb.connect()
    for name, t in tables.items():
        con.register(name, t)
    return con.sql(query).to_arrow_table().to_pylist()  # type: ignore[no-any-return]
