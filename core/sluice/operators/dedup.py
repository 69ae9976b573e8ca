"""Deduplication (``Stream.deduplicate``): one record per key and horizon, vectorized.

Semantics (docs/dedup_joins.md). Records of a key are taken in arrival order (per key, the order of its
input partition). A record whose key has no *open* horizon opens one at its time ``t`` (its event time, or
the processing time it is seen at) that covers ``[t, t + within)``; every later record of the key whose
time is before ``t + within`` belongs to it, the first record at or after ``t + within`` opens the next one.

* ``keep="first"``: the record that opens a horizon is emitted at once, the others are dropped.
* ``keep="last"``: one record per horizon, the one with the greatest ``order_by`` value (on a tie the one
  that arrived last), emitted when the horizon closes: when the watermark (processing time) reaches
  ``t + within``, or earlier when the next horizon of its key opens; at the end of a bounded input every
  open horizon is emitted.

State: per key, the open horizon's start (``keep="first"``: in value states per time bucket, dropped whole
when the clock passes them, with a Bloom filter per bucket so that new keys cost no state read:
:mod:`sluice.operators.horizons`) and, for ``keep="last"``, the best record so far (one value state per
column) and a timer at the horizon's end. Every step works on whole batches: the batch's distinct keys
(NumPy), batch-wise state reads and writes.
"""

from __future__ import annotations

import time
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice.errors import RestoreError
from sluice.keys import KeySelector
from sluice.operators.base import MIN_WATERMARK, Collector, Operator, OperatorContext, OperatorSnapshot
from sluice.operators.batchwise import distinct, event_ms, take_keys
from sluice.operators.horizons import HorizonStore, key_hashes
from sluice.state.api import ValueStateDescriptor
from sluice.state.spi import BatchValueState, KeyBatch, KeyedStateBackend, TimeDomain

__all__ = ["DeduplicateOperator"]

Keep = Literal["first", "last"]


def assign_horizons(
    codes: np.ndarray, t: np.ndarray, start: np.ndarray, has: np.ndarray, within: int
) -> tuple[np.ndarray, np.ndarray]:
    """Each row's horizon, numbered per key (0 = the key's open horizon from state, where ``has``; 1, 2, ...
    = the horizons its rows open in this batch, in arrival order), and which rows open one. ``start`` and
    ``has`` (per key code) are updated to each key's last horizon. One round of vectorized steps per horizon
    a key opens in the batch."""
    n = len(codes)
    horizon = np.zeros(n, np.int64)
    opener = np.zeros(n, bool)
    gen = np.zeros(len(start), np.int64)
    pending = np.arange(n)
    while len(pending):
        c = codes[pending]
        inside = has[c] & (t[pending] - start[c] < within)
        horizon[pending[inside]] = gen[c[inside]]
        rest = pending[~inside]
        if not len(rest):
            break
        _, first = np.unique(codes[rest], return_index=True)
        openers = rest[first]
        oc = codes[openers]
        gen[oc] += 1
        start[oc] = t[openers]
        has[oc] = True
        horizon[openers] = gen[oc]
        opener[openers] = True
        pending = np.delete(rest, first)
    return horizon, opener


class DeduplicateOperator(Operator):
    """One record per key and horizon (module docstring); keyed by ``key``, state in the job's backend."""

    operator_state_distribution = "union"  # keep="last": the row schema, for timers firing before any batch

    def __init__(
        self,
        name: str,
        key: KeySelector,
        within_ms: int,
        time_column: str | None,
        keep: Keep = "first",
        order_by: str | None = None,
        schema: pa.Schema | None = None,
    ) -> None:
        super().__init__(name)
        self.key = key
        self.within = within_ms
        self.time_column = time_column  # None: processing time
        self.keep = keep
        self.order_by = order_by
        self.schema = schema
        self.watermark = MIN_WATERMARK
        self.backend: KeyedStateBackend
        self._columns: list[BatchValueState] | None = None
        self._horizons: HorizonStore | None = None  # keep="first"

    @property
    def _domain(self) -> TimeDomain:
        return TimeDomain.PROCESSING if self.time_column is None else TimeDomain.EVENT

    def setup(self, ctx: OperatorContext, output: Collector) -> None:
        super().setup(ctx, output)
        self.backend = ctx.create_keyed_backend(self.name)
        if self.keep == "first":
            self._horizons = HorizonStore(self.backend, self.within)
        else:  # keep="last" clears a horizon's state when it is emitted
            self._start = self.backend.batch_state(ValueStateDescriptor("horizon_start", serializer="int64"))

    def initialize_state(self, keyed: list[dict[str, Any]], operator_states: list[Any]) -> None:
        if keyed:
            self.backend.restore(keyed)
            if self._horizons is not None and "horizon_start" in self.backend.state_meta():
                raise RestoreError(
                    f"deduplicate {self.name!r}: the checkpoint holds keep='first' state in the layout of an "
                    "earlier sluice (one horizon_start per key), which this version does not read; finish the "
                    "job with that version, or start without restoring (restore='none'), knowing that keys "
                    "seen within the horizon pass again"
                )
        if self._horizons is not None:
            self._horizons.restored()
        if self.schema is None:
            for s in operator_states:
                if s:
                    self.schema = pa.ipc.read_schema(pa.py_buffer(s))
                    break

    # -- records ----------------------------------------------------------------------------------------
    def _times(self, batch: pa.RecordBatch) -> np.ndarray:
        if self.time_column is None:
            return np.full(batch.num_rows, int(time.time() * 1000), np.int64)
        return event_ms(batch.column(self.time_column), f"{self.name}: time column {self.time_column!r}")

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if not batch.num_rows:
            return
        columns = self.key.arrays(batch)
        keys = self.backend.key_batch(columns)
        codes, firsts = distinct(keys)
        unique = take_keys(keys, firsts)
        t = self._times(batch)
        store = self._horizons
        if store is not None:  # keep="first"
            now = self.watermark if self.time_column is not None else int(t[0])
            if self.time_column is None:
                store.expire(now)
            hashes = key_hashes(unique)
            has, start = store.lookup(unique, hashes, now)
            before = np.where(has, start, np.iinfo(np.int64).min)
            _, opener = assign_horizons(codes, t, start, has, self.within)
            if opener.any():
                self.output.emit(batch if opener.all() else batch.filter(pa.array(opener)))
            changed = np.flatnonzero(start != before)
            if len(changed):
                store.write(take_keys(unique, changed), hashes[changed], start[changed], now)
            return
        stored = self._start.get(unique)
        has = np.array(stored.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        start = np.array(stored.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
        had = has.copy()
        horizon, _ = assign_horizons(codes, t, start, has, self.within)
        self._keep_last(batch, codes, unique, t, start, horizon, had)

    # -- watermarks, timers -----------------------------------------------------------------------------
    def process_watermark(self, timestamp: int) -> None:
        self.watermark = timestamp
        if self.time_column is not None:
            if self.keep == "last":
                self._fire(timestamp)
            elif self._horizons is not None:
                self._horizons.expire(timestamp)  # whole buckets whose horizons all ended
        self.output.emit_watermark(timestamp)

    def on_processing_time(self, now_ms: int) -> None:
        if self.time_column is None and self.keep == "last":
            self._fire(now_ms)

    def next_timer_ms(self) -> int | None:
        if self.time_column is None and self.keep == "last":
            return self.backend.timers.next_timestamp(TimeDomain.PROCESSING)
        return None

    def end_input(self) -> None:
        if self.keep == "last":
            self._fire(2**63 - 1)

    def snapshot_state(self, checkpoint_id: int, savepoint: bool = False) -> OperatorSnapshot:
        schema = self.schema.serialize().to_pybytes() if self.schema is not None and self.keep == "last" else None
        return OperatorSnapshot(keyed=self.backend.snapshot(checkpoint_id, savepoint), operator=schema)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.backend.notify_checkpoint_complete(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self.backend.notify_checkpoint_aborted(checkpoint_id)

    def close(self) -> None:
        self.backend.dispose()

    # -- keep="last" --------------------------------------------------------------------------------------
    def _row_states(self, schema: pa.Schema) -> list[BatchValueState]:
        if self._columns is None:
            self.schema = schema
            self._best = self.backend.batch_state(
                ValueStateDescriptor("best_order", serializer=schema.field(self.order_by or "").type)
            )
            self._columns = [
                self.backend.batch_state(ValueStateDescriptor(f"row.{i}", serializer=f.type))
                for i, f in enumerate(schema)
            ]
        return self._columns

    def _stored_rows(self, keys: KeyBatch) -> pa.RecordBatch:
        assert self.schema is not None
        cols = self._row_states(self.schema)
        return pa.RecordBatch.from_arrays([c.get(keys) for c in cols], schema=self.schema)

    def _keep_last(
        self,
        batch: pa.RecordBatch,
        codes: np.ndarray,
        unique: KeyBatch,
        t: np.ndarray,
        start: np.ndarray,
        horizon: np.ndarray,
        had: np.ndarray,
    ) -> None:
        """Per (key, horizon) the best row; horizons the batch closed are emitted, each key's open one is
        stored (a timer at its end for a horizon opened here)."""
        cols = self._row_states(batch.schema)
        order_col = batch.column(self.order_by or "")
        n = batch.num_rows
        rows = pa.table({"c": codes, "h": horizon, "o": order_col, "i": np.arange(n)})
        keys = [("c", "ascending"), ("h", "ascending"), ("o", "ascending", "at_start"), ("i", "ascending")]
        rows = rows.take(pc.sort_indices(rows, sort_keys=keys))  # a null order_by value orders first
        rc, rh = rows.column("c").to_numpy(), rows.column("h").to_numpy()
        last_of_group = np.r_[(rc[1:] != rc[:-1]) | (rh[1:] != rh[:-1]), True]
        g_code, g_h = rc[last_of_group], rh[last_of_group]
        g_row = rows.column("i").to_numpy()[last_of_group]  # the best batch row of each (key, horizon)
        g_order = rows.column("o").take(pa.array(np.flatnonzero(last_of_group)))
        last_h = np.zeros(len(start), np.int64)
        np.maximum.at(last_h, g_code, g_h)
        # horizon 0 continues the stored one: the stored best stays unless a batch row is at least as good
        stored_wins = np.zeros(len(g_code), bool)
        h0 = np.flatnonzero(g_h == 0)
        if len(h0):
            best = self._best.get(take_keys(unique, g_code[h0]))
            better = pc.fill_null(pc.greater(best, g_order.take(pa.array(h0))), False)
            better = pc.or_(better, pc.and_(pc.is_null(g_order.take(pa.array(h0))), pc.is_valid(best)))
            stored_wins[h0] = np.asarray(better.to_numpy(zero_copy_only=False), dtype=bool)
        closed = g_h < last_h[g_code]
        out = []
        emit_batch = closed & ~stored_wins
        if emit_batch.any():
            out.append(batch.take(pa.array(g_row[emit_batch])))
        # a stored horizon that a batch row closed without any row joining it
        gone = np.flatnonzero(had & (last_h > 0))
        joined = np.zeros(len(start), bool)
        joined[g_code[g_h == 0]] = True
        from_state = np.r_[g_code[closed & stored_wins], gone[~joined[gone]]].astype(np.int64)
        if len(from_state):
            out.append(self._stored_rows(take_keys(unique, from_state)))
        if out:
            self.output.emit(pa.Table.from_batches(out).combine_chunks().to_batches()[0])
        # the open horizon of every key: its best row into state (unless the stored one stays)
        write = ~closed & ~stored_wins
        if write.any():
            wk = take_keys(unique, g_code[write])
            picked = batch.take(pa.array(g_row[write]))
            for state, column in zip(cols, picked.columns, strict=True):
                state.put(wk, column)
            self._best.put(wk, g_order.filter(pa.array(write)))
        opened = np.flatnonzero(last_h > 0)
        if len(opened):
            ok = take_keys(unique, opened)
            self._start.put(ok, pa.array(start[opened]))
            timers, domain, ends = self.backend.timers, self._domain, (start[opened] + self.within).tolist()
            for end, kg, kb in zip(ends, ok.key_groups.tolist(), ok.keys, strict=True):
                timers.register(domain, end, kg, kb)

    def _fire(self, upto: int) -> None:
        """Emit and clear every horizon whose end is at or before ``upto``."""
        due = self.backend.timers.pop_due(self._domain, upto)
        if not due or self.schema is None:
            return
        keys = KeyBatch([d.key for d in due], np.array([d.key_group for d in due], np.int64))
        _, firsts = distinct(keys)
        keys = take_keys(keys, np.sort(firsts))
        start = self._start.get(keys)
        ends = pc.add(start.fill_null(2**62), self.within).to_numpy(zero_copy_only=False)
        ripe = np.flatnonzero(ends <= upto)  # a stale timer: its horizon was closed by the next one
        if not len(ripe):
            return
        keys = take_keys(keys, ripe)
        self.output.emit(self._stored_rows(keys))
        for state in (self._start, self._best, *self._row_states(self.schema)):
            state.delete(keys)
