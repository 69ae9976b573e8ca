"""Enrichment join (``Stream.join_latest``): each left record with the latest row of its key in the right
stream, a table (a compacted topic of dimension rows): Flink's temporal join, Kafka Streams' KStream-KTable
join.

The table is held in keyed state (hashmap or RocksDB), each key's row as one binary value
(:mod:`~sluice.operators.joins.rows`), read once per batch of facts and written once per batch of table rows. A right row upserts its key; a tombstone (a ``_sluice_op`` of DELETE, or a row
whose columns other than the key and the time are all null, as a Kafka tombstone decodes) deletes it.

* processing time (no ``event_time``): a left record joins the table as it is when the record is processed
  (Kafka Streams); a left record whose key has no row yet is dropped (inner) or emitted with nulls (left).
* event time: both sides wait until the watermark (the minimum of both inputs) passes their time; then each
  left record joins the latest right row of its key whose time is at or before its own (Flink's event-time
  temporal join). The result does not depend on which input ran ahead: a left record that comes before its
  dimension row in time finds none (inner: dropped, left: nulls) however the inputs interleave. A table
  side that delivers nothing for ``table_idle_timeout_s`` (a quiet topic) leaves the minimum until it
  delivers again (:mod:`sluice.runtime.watermarks`), so the records go on joining the table as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice.changes import OP, ORDER, Op
from sluice.errors import RestoreError
from sluice.operators.base import MIN_WATERMARK, Collector, Operator, OperatorContext, OperatorSnapshot
from sluice.operators.batchwise import ArrowBuffer, distinct, event_ms, take_keys
from sluice.operators.joins.common import joined, right_names
from sluice.operators.joins.rows import RowCodec, decode_rows
from sluice.state.api import ValueStateDescriptor
from sluice.state.spi import BatchValueState, KeyBatch, KeyedStateBackend

__all__ = ["LatestJoinOperator"]

How = Literal["inner", "left"]


class LatestJoinOperator(Operator):
    """Left records (input 0) joined with the latest right row (input 1) of their key (module docstring)."""

    operator_state_distribution = "union"  # buffers of rows waiting for the watermark, kept by key group

    def __init__(
        self,
        name: str,
        left_key: Sequence[str],
        right_key: Sequence[str],
        how: How = "inner",
        left_time: str | None = None,
        right_time: str | None = None,
        right_schema: pa.Schema | None = None,
        suffix: str = "_right",
        table_idle_timeout_s: float | None = None,
    ) -> None:
        super().__init__(name)
        if left_time is not None and table_idle_timeout_s is not None:
            self.input_idle_timeouts = {1: table_idle_timeout_s}
        self.left_key, self.right_key = list(left_key), list(right_key)
        self.how = how
        self.left_time, self.right_time = left_time, right_time
        self.right_schema = right_schema
        self.suffix = suffix
        self.watermark = MIN_WATERMARK
        self.facts = ArrowBuffer(self.left_key)
        self.table = ArrowBuffer(self.right_key)
        self.backend: KeyedStateBackend
        self._row: BatchValueState
        #: every schema the table's rows in state were written with, by schema id; the current one
        self._codecs: dict[int, RowCodec] = {}
        self._codec: RowCodec | None = None

    @property
    def event_time(self) -> bool:
        return self.left_time is not None

    def setup(self, ctx: OperatorContext, output: Collector) -> None:
        super().setup(ctx, output)
        self.backend = ctx.create_keyed_backend(self.name)
        self._row = self.backend.batch_state(ValueStateDescriptor("row", serializer="binary"))

    def initialize_state(self, keyed: list[dict[str, Any]], operator_states: list[Any]) -> None:
        if keyed:
            self.backend.restore(keyed)
            if any(n == "version" or n.startswith("col.") for n in self.backend.state_meta()):
                raise RestoreError(
                    f"join_latest {self.name!r}: the checkpoint holds the table in the layout of an earlier "
                    "sluice (a state per column), which this version does not read; start the job without "
                    "restoring it (restore='none') so that it reads the table's topic again"
                )
        kgs, mp = self.ctx.key_groups, self.ctx.max_parallelism
        for s in operator_states:
            if not s:
                continue
            for raw in s.get("row_schemas") or ():
                self._register(RowCodec(pa.ipc.read_schema(pa.py_buffer(raw))))
            if self.right_schema is None and s.get("schema"):
                self.right_schema = pa.ipc.read_schema(pa.py_buffer(s["schema"]))
            self.facts.restore([s.get("facts")], kgs, mp)
            self.table.restore([s.get("table")], kgs, mp)

    # -- the table in keyed state --------------------------------------------------------------------------
    def _register(self, codec: RowCodec) -> RowCodec:
        return self._codecs.setdefault(codec.id, codec)

    def _current(self) -> RowCodec:
        """The codec of every table column the output carries (the right stream's schema, learned from its
        first batch when it was not known when the job was built)."""
        if self._codec is None:
            assert self.right_schema is not None
            skip = {*self.right_key, OP, ORDER}
            self._codec = self._register(RowCodec(pa.schema([f for f in self.right_schema if f.name not in skip])))
        return self._codec

    def _columns(self) -> list[str]:
        return list(self._current().schema.names)

    def _keys(self, data: pa.RecordBatch | pa.Table, names: Sequence[str]) -> KeyBatch:
        return self.backend.key_batch([data.column(c) for c in names])

    def _tombstones(self, rows: pa.Table) -> np.ndarray:
        if OP in rows.column_names:
            return np.asarray(pc.equal(rows.column(OP), int(Op.DELETE)).fill_null(False).to_numpy(zero_copy_only=False), bool)
        names = [c for c in self._columns() if c != self.right_time]
        if not names:
            return np.zeros(rows.num_rows, bool)
        dead = pc.is_null(rows.column(names[0]))
        for c in names[1:]:
            dead = pc.and_(dead, pc.is_null(rows.column(c)))
        return np.asarray(dead.to_numpy(zero_copy_only=False), bool)

    def _apply(self, rows: pa.Table) -> None:
        """Upsert (or delete, for tombstones) each key's last row of ``rows`` (in their order)."""
        keys = self._keys(rows, self.right_key)
        codes, _ = distinct(keys)
        last = np.full(int(codes.max()) + 1, -1, np.int64)
        np.maximum.at(last, codes, np.arange(len(codes)))
        dead = self._tombstones(rows)
        gone, live = last[dead[last]], last[~dead[last]]
        if len(gone):
            self._row.delete(take_keys(keys, gone))
        if len(live):
            self._row.put(take_keys(keys, live), self._current().encode(rows.take(pa.array(live))))

    def _lookup(self, facts: pa.Table) -> tuple[np.ndarray, dict[str, pa.Array]]:
        """Each fact's table row in state now: whether it has one, and the row's columns (one state read
        for the batch's distinct keys)."""
        keys = self._keys(facts, self.left_key)
        codes, firsts = distinct(keys)
        values = self._row.get(take_keys(keys, firsts))
        found = np.asarray(values.is_valid().to_numpy(zero_copy_only=False), bool)[codes]
        codec = self._current()
        columns = decode_rows(values, self._codecs, codec, self.name)
        take = pa.array(codes)
        return found, {c: a.take(take) for c, a in zip(codec.schema.names, columns, strict=True)}

    # -- output -----------------------------------------------------------------------------------------
    def _emit(self, facts: pa.Table, found: np.ndarray, dims: dict[str, pa.Array]) -> None:
        if self.how == "inner":
            if not found.all():
                mask = pa.array(found)
                facts, dims = facts.filter(mask), {c: a.filter(mask) for c, a in dims.items()}
        elif not found.all():  # a dimension row's values where found, nulls elsewhere
            idx = pa.array(np.arange(len(found)), mask=~found)
            dims = {c: a.take(idx) for c, a in dims.items()}
        if not facts.num_rows:
            return
        assert self.right_schema is not None
        names = right_names(facts.column_names, self._columns(), [], self.suffix)
        fields = [*facts.schema, *(self.right_schema.field(c).with_name(names[c]) for c in dims)]
        self.output.emit(joined(facts, {names[c]: a for c, a in dims.items()}, pa.schema(fields)))

    def _no_table(self, facts: pa.Table) -> None:
        """Facts while the table side has never delivered a row (its columns unknown): inner drops them."""
        if self.how == "left":  # the API refuses a left join without the right schema
            raise AssertionError("left join without the table's schema")

    # -- records and time ---------------------------------------------------------------------------------
    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if not batch.num_rows:
            return
        if input_index == 1:
            if self.right_schema is None:
                self.right_schema = batch.schema
            if self.event_time:
                self.table.add(batch)
            else:
                self._apply(pa.Table.from_batches([batch]))
            return
        if self.event_time:
            self.facts.add(batch)
        elif self.right_schema is None:
            self._no_table(pa.Table.from_batches([batch]))
        else:
            facts = pa.Table.from_batches([batch])
            self._emit(facts, *self._lookup(facts))

    def process_watermark(self, timestamp: int) -> None:
        self.watermark = timestamp
        if self.event_time:
            self._release(timestamp)
        self.output.emit_watermark(timestamp)

    def end_input(self) -> None:
        if self.event_time:
            self._release(2**63 - 1)

    def _due(self, buffer: ArrowBuffer, column: str, upto: int) -> tuple[pa.Table, np.ndarray]:
        """The rows of ``buffer`` at or before ``upto`` (taken out of it), and their times."""
        if not len(buffer):
            return pa.table({}), np.zeros(0, np.int64)
        rows = buffer.table()
        t = event_ms(rows.column(column), f"{self.name}: time column {column!r}")
        due = t <= upto
        buffer.keep(~due)
        return rows.filter(pa.array(due)), t[due]

    def _release(self, upto: int) -> None:
        """Join the facts the watermark released with the table as of each fact's time."""
        assert self.left_time is not None and self.right_time is not None
        table, tt = self._due(self.table, self.right_time, upto)
        facts, ft = self._due(self.facts, self.left_time, upto)
        if table.num_rows:
            order = np.argsort(tt, kind="stable")  # table rows in time order, arrival order on a tie
            table, tt = table.take(pa.array(order)), tt[order]
        if not facts.num_rows:
            if table.num_rows:
                self._apply(table)
            return
        if self.right_schema is None:
            self._no_table(facts)
            return
        match = self._as_of(table, tt, facts, ft)
        found, dims = self._lookup(facts)  # the table before this release (older than every fact here)
        if table.num_rows:
            hit = match >= 0
            dead = self._tombstones(table)
            rows = table.take(pa.array(np.where(hit, match, 0)))
            found = np.where(hit, ~dead[np.where(hit, match, 0)], found)
            mask = pa.array(hit)
            dims = {c: pc.if_else(mask, rows.column(c).combine_chunks(), a) for c, a in dims.items()}
            self._apply(table)
        self._emit(facts, found, dims)

    def _as_of(self, table: pa.Table, tt: np.ndarray, facts: pa.Table, ft: np.ndarray) -> np.ndarray:
        """For each fact, the last table row (index into ``table``, in time order) of its key with a time at
        or before the fact's; -1 where none."""
        n_t = table.num_rows
        if not n_t:
            return np.full(facts.num_rows, -1, np.int64)
        cols = [
            pa.concat_arrays([table.column(r).combine_chunks(), facts.column(c).combine_chunks().cast(table.schema.field(r).type)])
            for r, c in zip(self.right_key, self.left_key, strict=True)
        ]
        codes, _ = distinct(self.backend.key_batch(cols))
        t = np.r_[tt, ft]
        side = np.r_[np.zeros(n_t, np.int8), np.ones(len(ft), np.int8)]
        seq = np.r_[np.arange(n_t), np.arange(len(ft))]
        order = np.lexsort((seq, side, t, codes))  # by key, time, table rows before facts of equal time
        pos = np.arange(len(order))
        is_t = side[order] == 0
        last_t = np.maximum.accumulate(np.where(is_t, pos, -1))
        out = np.full(len(ft), -1, np.int64)
        f_pos = pos[~is_t]
        q = last_t[f_pos]
        ok = (q >= 0) & (codes[order[np.maximum(q, 0)]] == codes[order[f_pos]])
        out[seq[order[f_pos]][ok]] = seq[order[q[ok]]]
        return out

    # -- checkpoints ----------------------------------------------------------------------------------------
    def snapshot_state(self, checkpoint_id: int, savepoint: bool = False) -> OperatorSnapshot:
        schema = self.right_schema.serialize().to_pybytes() if self.right_schema is not None else None
        rows = [c.schema.serialize().to_pybytes() for c in self._codecs.values()]
        state = {"facts": self.facts.snapshot(), "table": self.table.snapshot(), "schema": schema, "row_schemas": rows}
        return OperatorSnapshot(keyed=self.backend.snapshot(checkpoint_id, savepoint), operator=state)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.backend.notify_checkpoint_complete(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self.backend.notify_checkpoint_aborted(checkpoint_id)

    def close(self) -> None:
        self.backend.dispose()
