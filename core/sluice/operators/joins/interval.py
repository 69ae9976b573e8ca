"""Interval join (``Stream.interval_join``): pairs of a left and a right record with the same key whose
times satisfy ``left.t + lower <= right.t <= left.t + upper`` (Flink's ``left.intervalJoin(right).between(
lower, upper)``; either bound may be negative).

Each side's records wait in an Arrow buffer of the operator until no future record of the other side can
match them: a left record until the watermark passes ``left.t + upper``, a right record until it passes
``right.t - lower``. A record joins the other side's buffer when it arrives (one hash join per batch,
``pyarrow``), so every pair is emitted exactly once, when its second record arrives. Records behind the
watermark (late) are dropped and counted (``late_records_dropped``), as in Flink. The buffers are
checkpointed whole, as Arrow IPC in the operator's state, and split by key group on restore.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from sluice.operators.base import MIN_WATERMARK, Operator, OperatorSnapshot
from sluice.operators.batchwise import ArrowBuffer, event_ms
from sluice.operators.joins.common import right_names

__all__ = ["IntervalJoinOperator"]

_T = "__sluice_t"


class IntervalJoinOperator(Operator):
    """Left (input 0) and right (input 1) records of one key with ``right.t - left.t`` in ``[lower, upper]``."""

    operator_state_distribution = "union"

    def __init__(
        self,
        name: str,
        left_key: Sequence[str],
        right_key: Sequence[str],
        left_time: str,
        right_time: str,
        lower_ms: int,
        upper_ms: int,
        suffix: str = "_right",
    ) -> None:
        super().__init__(name)
        self.keys = (list(left_key), list(right_key))
        self.times = (left_time, right_time)
        self.lower, self.upper = lower_ms, upper_ms
        self.suffix = suffix
        self.watermark = MIN_WATERMARK
        self.buffers = (ArrowBuffer(self.keys[0]), ArrowBuffer(self.keys[1]))
        #: per side, the earliest watermark that can release one of its buffered records
        self._next_expiry = [2**63 - 1, 2**63 - 1]

    def initialize_state(self, keyed: list[dict[str, Any]], operator_states: list[Any]) -> None:
        kgs, mp = self.ctx.key_groups, self.ctx.max_parallelism
        for side in (0, 1):
            self.buffers[side].restore([s[side] for s in operator_states if s], kgs, mp)
            self._update_expiry(side)

    def _bound(self, side: int) -> int:
        """How far past a record's time of ``side`` a record of the other side may still match it."""
        return self.upper if side == 0 else -self.lower

    def _update_expiry(self, side: int) -> None:
        buf = self.buffers[side]
        if not len(buf):
            self._next_expiry[side] = 2**63 - 1
            return
        t = event_ms(buf.table().column(_T), f"{self.name}: time")
        self._next_expiry[side] = int(t.min()) + self._bound(side) + 1

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if not batch.num_rows:
            return
        side = input_index
        t = event_ms(batch.column(self.times[side]), f"{self.name}: time column {self.times[side]!r}")
        late = t < self.watermark
        if late.any():
            self.ctx.metric("late_records_dropped", int(late.sum()))
            batch, t = batch.filter(pa.array(~late)), t[~late]
            if not batch.num_rows:
                return
        rows = batch.append_column(_T, pa.array(t))
        other = self.buffers[1 - side]
        if len(other):
            left, right = (rows, other.table()) if side == 0 else (other.table(), rows)
            self._join(pa.Table.from_batches([left]) if isinstance(left, pa.RecordBatch) else left,
                       pa.Table.from_batches([right]) if isinstance(right, pa.RecordBatch) else right)
        self.buffers[side].add(rows)
        self._next_expiry[side] = min(self._next_expiry[side], int(t.min()) + self._bound(side) + 1)

    def _join(self, left: pa.Table, right: pa.Table) -> None:
        lk, rk = self.keys
        names = right_names([c for c in left.column_names if c != _T], [c for c in right.column_names if c != _T], rk, self.suffix)
        r = right.select([*rk, _T, *names]).rename_columns([*(f"__k{i}" for i in range(len(rk))), "__rt", *names.values()])
        pairs = left.join(r, keys=lk, right_keys=[f"__k{i}" for i in range(len(rk))], join_type="inner", coalesce_keys=True)
        if not pairs.num_rows:
            return
        lt = pairs.column(_T).to_numpy()
        rt = pairs.column("__rt").to_numpy()
        ok = (lt + self.lower <= rt) & (rt <= lt + self.upper)
        if not ok.any():
            return
        out = pairs.filter(pa.array(ok)).select([*(c for c in left.column_names if c != _T), *names.values()])
        for b in out.combine_chunks().to_batches():
            self.output.emit(b)

    def process_watermark(self, timestamp: int) -> None:
        self.watermark = timestamp
        for side in (0, 1):
            buf = self.buffers[side]
            # an empty buffer's expiry is 2**63 - 1, which the end-of-input watermark reaches; a buffer that
            # never held a row (a subtask without rows, also after a restore) has no columns to read
            if timestamp >= self._next_expiry[side] and len(buf):
                t = event_ms(buf.table().column(_T), f"{self.name}: time")
                buf.keep(t + self._bound(side) >= timestamp)
                self._update_expiry(side)
        self.output.emit_watermark(timestamp)

    def snapshot_state(self, checkpoint_id: int, savepoint: bool = False) -> OperatorSnapshot:
        return OperatorSnapshot(operator=[self.buffers[0].snapshot(), self.buffers[1].snapshot()])
