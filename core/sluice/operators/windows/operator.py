"""The window operator: keyed event-time (or processing-time) windows with vectorized aggregation.

Per batch: the windows of every row (:mod:`~sluice.operators.windows.assign`), rows of windows already
cleaned up to the ``late`` side output, then one ``group_by`` into partial aggregates per (key, window)
kept in memory until the next *flush*. A flush (before every checkpoint's snapshot, before windows fire,
and when the pending partials pass ``max_pending_rows``) merges them and appends them to the window state
in the job's keyed state backend (:mod:`~sluice.operators.windows.store`). When the watermark passes a
window's end, the key groups whose timers are due fire: their windows that closed are emitted and their
state dropped; with ``allowed_lateness`` a fired window stays until ``end + allowed_lateness`` and a
record arriving for it emits the window's updated result at once (a new row, ``revision`` one higher).
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice.errors import ConfigError
from sluice.keys import KeySelector
from sluice.operators.base import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    Collector,
    Operator,
    OperatorContext,
    OperatorSnapshot,
)
from sluice.operators.windows.aggregates import finalize, merge, partial
from sluice.operators.windows.assign import assign, merge_sessions
from sluice.operators.windows.spec import Agg, Session, WindowAssigner
from sluice.operators.windows.store import MAX_SEGMENTS, SegmentStore
from sluice.state.keygroups import hash_columns, key_groups
from sluice.state.spi import KeyedStateBackend, TimeDomain

__all__ = ["LATE", "WindowOperator"]

#: the side output of records that arrive after their windows were cleaned up (dropped and counted if no
#: stream reads it)
LATE = "late"
_WARN_EVERY_S = 60.0
log = logging.getLogger("sluice.windows")
_TIME_TYPE = b"sluice.window.time_type"


class WindowOperator(Operator):
    """Windows over a keyed stream, aggregated with ``aggs`` (see the module docstring).

    Args:
        name: the operator's name.
        key: the stream's key (its columns are the result's key columns; a key function's is ``key``).
        assigner: :class:`~sluice.operators.windows.spec.Tumbling`, ``Sliding`` or ``Session``.
        aggs: the aggregations.
        time: the event-time column (int64 ms or a timestamp), or None for processing time.
        allowed_lateness: ms after a window's end during which records still update it.
        max_pending_rows: partial rows kept in memory before a flush into the state backend.
    """

    def __init__(
        self,
        name: str,
        key: KeySelector,
        assigner: WindowAssigner,
        aggs: tuple[Agg, ...],
        time: str | None,
        allowed_lateness: int = 0,
        max_pending_rows: int = 200_000,
    ) -> None:
        super().__init__(name)
        self.key = key
        self.assigner = assigner
        self.aggs = aggs
        self.time = time
        self.lateness = allowed_lateness
        self.max_pending_rows = max_pending_rows
        self.watermark = MIN_WATERMARK
        self.domain = TimeDomain.EVENT if time is not None else TimeDomain.PROCESSING
        self.backend: KeyedStateBackend
        self.store: SegmentStore
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._pending_due: int | None = None  # the earliest time a pending window fires
        self._key_names: list[str] = list(key._columns or ["key"])
        self._time_type: pa.DataType = pa.int64() if time is not None else pa.timestamp("ms", "UTC")
        self._time_seen = False  # the type of the time column is known from a batch
        self._late_warned = -_WARN_EVERY_S

    @property
    def session(self) -> bool:
        return isinstance(self.assigner, Session)

    def setup(self, ctx: OperatorContext, output: Collector) -> None:
        super().setup(ctx, output)
        self.backend = ctx.create_keyed_backend(self.name)
        self.store = SegmentStore(self.backend, self.domain)

    def initialize_state(self, keyed: list[dict[str, Any]], operator_states: list[Any]) -> None:
        if keyed:
            self.backend.restore(keyed)
            self.store.forget()

    # -- input ------------------------------------------------------------------------------------------
    def _times(self, batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray]:
        """Each row's time (ms) and whether it has one."""
        if self.time is None:
            now = int(time.time() * 1000)
            return np.full(batch.num_rows, now, np.int64), np.ones(batch.num_rows, bool)
        try:
            col = batch.column(self.time)
        except KeyError:
            raise ConfigError(
                f"{self.name}: the event-time column {self.time!r} is not in the batch (columns: {batch.schema.names})"
            ) from None
        self._time_seen = True
        if pa.types.is_timestamp(col.type):
            self._time_type = col.type
            col = pc.cast(pc.cast(col, pa.timestamp("ms", col.type.tz)), pa.int64())
        elif not pa.types.is_integer(col.type):
            raise ConfigError(
                f"{self.name}: the event-time column {self.time!r} has type {col.type}; expected int64 "
                "milliseconds or a timestamp"
            )
        else:
            self._time_type = pa.int64()
            col = pc.cast(col, pa.int64())
        valid = pc.is_valid(col).to_numpy(zero_copy_only=False)
        return pc.fill_null(col, 0).to_numpy(zero_copy_only=False), valid

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if not batch.num_rows:
            return
        keys = self.key.arrays(batch)
        t, valid = self._times(batch)
        rows, start, end = assign(self.assigner, t)
        cleanup = end - 1 + self.lateness
        live = valid[rows] & (cleanup > self.watermark)
        kept_rows = np.zeros(batch.num_rows, bool)
        kept_rows[rows[live]] = True
        if not kept_rows.all():  # every window of these rows is cleaned up already (or they have no time)
            late = batch.filter(pa.array(~kept_rows))
            self.ctx.metric("late_records", late.num_rows)
            if self.output.has_side(LATE):
                self.output.emit_side(LATE, late)
            else:  # as Flink without sideOutputLateData: dropped, counted (numLateRecordsDropped), not fatal
                self._warn_late(late.num_rows)
        if not live.any():
            return
        rows, start, end = rows[live], start[live], end[live]
        idx = pa.array(rows)
        cols: dict[str, Any] = {f"__k{i}": pc.take(k, idx) for i, k in enumerate(keys)}
        cols.update(__ws=start, __we=end, __t=pa.array(t).take(idx))
        for i, a in enumerate(self.aggs):
            src = batch.column(a.column) if a.column is not None else cols["__t"]
            cols[f"__v{i}"] = src if a.column is None else pc.take(src, idx)
        part = partial(pa.table(cols), len(keys), self.aggs)
        self._pending.append(part)
        self._pending_rows += part.num_rows
        due = int(end.min()) - 1
        self._pending_due = due if self._pending_due is None else min(self._pending_due, due)
        if (end - 1 <= self.watermark).any():  # updates of fired windows, within the allowed lateness
            self._flush()
            self._fire(self._touched(part), self.watermark)
        elif self._pending_rows >= self.max_pending_rows:
            self._flush()

    def _warn_late(self, n: int) -> None:
        now = time.monotonic()
        if now - self._late_warned >= _WARN_EVERY_S:
            self._late_warned = now
            log.warning(
                "%s: %d record(s) arrived after their windows closed (watermark %d) and are dropped (metric "
                "late_records); connect .side_output(%r) to keep them, or raise the source's "
                "max_out_of_orderness or allowed_lateness",
                self.name,
                n,
                self.watermark,
                LATE,
            )

    def _kgs(self, table: pa.Table) -> np.ndarray:
        n = len(self._key_names)
        kgs = key_groups(
            hash_columns([table.column(f"__k{i}").combine_chunks() for i in range(n)]),
            self.ctx.max_parallelism,
        )
        r = self.ctx.key_groups
        if len(kgs) and (kgs.min() < r.start or kgs.max() >= r.end):
            raise RuntimeError(f"{self.name}: keys of key groups outside {r} reached this subtask")
        return kgs

    def _touched(self, part: pa.Table) -> list[int]:
        return sorted(set(self._kgs(part).tolist()))

    # -- state ------------------------------------------------------------------------------------------
    def _merge(self, table: pa.Table) -> pa.Table:
        nkeys = len(self._key_names)
        return merge(merge_sessions(table, nkeys) if self.session else table, nkeys, self.aggs)

    def _flush(self) -> None:
        """Merge the pending partials and append them to the state backend, a segment per key group."""
        if not self._pending:
            return
        table = self._merge(pa.concat_tables(self._pending, promote_options="permissive"))
        self._pending, self._pending_rows, self._pending_due = [], 0, None
        # the time column's type rides with the state: a restored job fires windows of the same type before
        # (or without) seeing a batch
        meta = {_TIME_TYPE: pa.schema([pa.field("t", self._time_type)]).serialize().to_pybytes().hex()}
        table = table.replace_schema_metadata(meta)
        kgs = self._kgs(table)
        order = np.argsort(kgs, kind="stable")
        table, kgs = table.take(pa.array(order)), kgs[order]
        cuts = [0, *(np.flatnonzero(np.diff(kgs)) + 1).tolist(), len(kgs)]
        we = table.column("__we").to_numpy()
        for a, b in itertools.pairwise(cuts):
            kg = int(kgs[a])
            if self.store.add(kg, table.slice(a, b - a)) > MAX_SEGMENTS:
                self.store.replace(
                    kg, self._merge(pa.concat_tables(self.store.read(kg), promote_options="permissive"))
                )
            self.store.timer(kg, int(we[a:b].min()) - 1)

    def _fire(self, kgs: list[int], wm: int) -> None:
        """Emit the closed windows of key groups ``kgs`` at time ``wm`` and drop those cleaned up (one merge
        over every key group's segments; the state written back per key group)."""
        tables = []
        for kg in kgs:
            segments = self.store.read(kg)
            if (
                segments
                and not self._time_seen
                and (meta := segments[0].schema.metadata)
                and _TIME_TYPE in meta
            ):
                self._time_type = (
                    pa.ipc.read_schema(pa.py_buffer(bytes.fromhex(meta[_TIME_TYPE].decode()))).field(0).type
                )
            tables += [t.append_column("__kg", pa.array(np.full(t.num_rows, kg, np.int64))) for t in segments]
        if not tables:
            return
        m = self._merge_with_kg(pa.concat_tables(tables, promote_options="permissive"))
        fire_at = pc.subtract(m.column("__we"), 1)
        dirty = pc.equal(m.column("__dirty"), 1)
        emit = pc.and_(pc.less_equal(fire_at, wm), dirty)
        keep = pc.greater(pc.add(fire_at, self.lateness), wm)
        fired = m.filter(emit) if pc.any(emit).as_py() else None
        m = m.set_column(
            m.schema.get_field_index("__dirty"),
            "__dirty",
            pc.cast(pc.and_(dirty, pc.invert(emit)), pa.int8()),
        )
        m = m.set_column(
            m.schema.get_field_index("__fires"),
            "__fires",
            pc.add(m.column("__fires"), pc.cast(emit, pa.int64())),
        )
        rest = m.filter(keep)
        left = set(kgs)
        if rest.num_rows:
            rest = rest.take(pc.sort_indices(rest.column("__kg")))
            at = pc.if_else(
                pc.equal(rest.column("__dirty"), 1),
                pc.subtract(rest.column("__we"), 1),
                pc.add(pc.subtract(rest.column("__we"), 1), self.lateness),
            ).to_numpy()
            kg_col = rest.column("__kg").to_numpy()
            rest = rest.drop_columns(["__kg"])
            cuts = [0, *(np.flatnonzero(np.diff(kg_col)) + 1).tolist(), len(kg_col)]
            for a, b in itertools.pairwise(cuts):
                kg = int(kg_col[a])
                left.discard(kg)
                self.store.replace(kg, rest.slice(a, b - a))
                self.store.timer(kg, int(at[a:b].min()))
        for kg in left:
            self.store.replace(kg, None)
        if fired is not None:
            out = finalize(fired, self._key_names, self.aggs, self._time_type, self.lateness > 0)
            self.ctx.metric("windows_fired", out.num_rows)
            for batch in out.combine_chunks().to_batches():
                self.output.emit(batch)

    def _merge_with_kg(self, table: pa.Table) -> pa.Table:
        """Merge partials that carry their key group (``__kg``, a function of the key: kept per group)."""
        kg = table.column("__kg")
        nkeys = len(self._key_names)
        # the key group rides along as a key column, so that it survives the merge
        t = table.drop_columns(["__kg"])
        t = t.add_column(nkeys, f"__k{nkeys}", kg)
        m = merge(merge_sessions(t, nkeys + 1) if self.session else t, nkeys + 1, self.aggs)
        return m.append_column("__kg", m.column(f"__k{nkeys}")).drop_columns([f"__k{nkeys}"])

    def _advance(self, now: int) -> None:
        """Fire what is due at ``now`` (the watermark, or the processing time)."""
        nxt = self.store.earliest()
        if (self._pending_due is not None and self._pending_due <= now) or (nxt is not None and nxt <= now):
            self._flush()  # pending partials may belong to what fires (and extend a session that would)
            self._fire(self.store.pop_due(now), now)

    def process_watermark(self, timestamp: int) -> None:
        if self.domain is TimeDomain.EVENT and timestamp > self.watermark:
            self.watermark = timestamp
            self._advance(timestamp)
        self.output.emit_watermark(timestamp)

    def on_processing_time(self, now_ms: int) -> None:
        if self.domain is TimeDomain.PROCESSING:
            self._advance(now_ms)

    def next_timer_ms(self) -> int | None:
        if self.domain is not TimeDomain.PROCESSING:
            return None
        times = [t for t in (self._pending_due, self.store.earliest()) if t is not None]
        return min(times) if times else None

    def end_input(self) -> None:
        # a bounded input ended: event time reaches its end (as Flink's final MAX_WATERMARK), every window
        # fires, processing-time ones too
        if self.domain is TimeDomain.EVENT:
            self.watermark = MAX_WATERMARK
        self._advance(MAX_WATERMARK)

    # -- checkpoints ------------------------------------------------------------------------------------
    def snapshot_state(self, checkpoint_id: int, savepoint: bool = False) -> OperatorSnapshot:
        self._flush()
        return OperatorSnapshot(keyed=self.backend.snapshot(checkpoint_id, savepoint))

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.backend.notify_checkpoint_complete(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self.backend.notify_checkpoint_aborted(checkpoint_id)

    def close(self) -> None:
        self.backend.dispose()
