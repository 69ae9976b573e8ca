"""Change batches (:mod:`sluice.changes`) from Kafka messages: what the Debezium and keyed-upsert formats share.

A :class:`ChangeDecoder` decodes a batch's values with one value decoder and the keys it needs with
another (each a :class:`~.base.ValueDecoder`: JSON parsed a batch at a time, Avro column by column), lets
its format turn the decoded values into rows and operations (:meth:`ChangeDecoder._changes`), and
assembles the change batch with Arrow: key columns, row columns, extra columns, ``_sluice_op`` and
``_sluice_order`` (the record's offset), the key columns named in the schema metadata
(:func:`sluice.changes.with_keys`). Python runs per record only to read the message keys off the
messages and to write the errors of bad records.

Bad records (the bad-record contract of :mod:`.base`): a value or key that does not decode, a change
without a key (no message key, a key column that is null), and whatever the format refuses (an unknown
Debezium ``op``).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
from sluice.changes import OP, ORDER, Op, with_keys
from sluice.connectors.kafka.formats.base import Decoded, ValueDecoder
from sluice.connectors.kafka.formats.messages import Messages
from sluice.connectors.kafka.formats.schemas import align

__all__ = ["ChangeDecoder", "Changes"]

_NO_KEY = "a change needs a message key (the row's key) and this record has none"


class Changes:
    """What a format makes of its decoded values: one entry per decoded value.

    Attributes:
        rows: the row columns.
        ops: each row's operation (int8, :class:`sluice.changes.Op`).
        extra: further columns (``_ts_ms``...), after the row columns.
        bad: ``(row index, error)`` of the values the format refuses.
    """

    def __init__(
        self,
        rows: pa.RecordBatch,
        ops: np.ndarray,
        extra: dict[str, pa.Array] | None = None,
        bad: list[tuple[int, str]] | None = None,
    ) -> None:
        self.rows, self.ops, self.extra, self.bad = rows, ops, extra or {}, bad or []


class ChangeDecoder(ValueDecoder):
    """Decodes messages into change batches (see the module docstring).

    As a :class:`~.base.ValueDecoder` it is its value decoder: the schema the enumerator samples
    (``decode``), the readers adopt and checkpoints keep is the decoded values' (a Debezium envelope's, an
    upsert row's), so an inferred row schema is steady across readers and restores as ``json``'s is.

    Args:
        values: decodes the message values (null values are tombstones).
        keys: decodes the message keys.
        key_columns: the key columns, taken from the rows (None: the fields of the decoded message key; the
            key's one column is named ``key_column`` when that is given).
        tombstone_deletes: a null value deletes the row its message key names (else it is skipped and
            counted).
        row_schema: the row columns' schema (unknown fields dropped, missing ones null); None: as decoded.
        key_column: the name of a scalar key's one column.
    """

    def __init__(
        self,
        values: ValueDecoder,
        keys: ValueDecoder,
        *,
        key_columns: Sequence[str] | None = None,
        tombstone_deletes: bool = True,
        row_schema: pa.Schema | None = None,
        key_column: str | None = None,
    ) -> None:
        self.values = values
        self.keys = keys
        self.key_columns = list(key_columns) if key_columns is not None else None
        self.tombstone_deletes = tombstone_deletes
        self.row_schema = row_schema
        self.key_column = key_column

    # -- the value decoder's steady schema --------------------------------------------------------------
    @property
    def schema(self) -> pa.Schema | None:
        """The decoded values' schema so far."""
        return self.values.schema

    @schema.setter
    def schema(self, schema: pa.Schema | None) -> None:
        self.values.schema = schema

    def decode(self, values: list[bytes | None], nbytes: int | None = None) -> Decoded:
        """Decode the values alone (the enumerator's schema sample)."""
        return self.values.decode(values, nbytes)

    def _decode(self, values: list[bytes]) -> Decoded:
        return self.values.decode(list(values))

    def adopt(self, schema: pa.Schema | None) -> None:
        self.values.adopt(schema)

    @property
    def steady_schema(self) -> pa.Schema | None:
        return self.values.steady_schema

    # -- changes ---------------------------------------------------------------------------------------
    @abstractmethod
    def _changes(self, decoded: pa.RecordBatch) -> Changes:
        """The rows and operations of the decoded values."""

    def _extra_nulls(self, n: int) -> dict[str, pa.Array]:
        """The extra columns of ``n`` tombstone deletes."""
        return {}

    def decode_messages(self, messages: Messages) -> Decoded:
        """Decode ``messages`` into one change batch (rows in message order)."""
        n = len(messages)
        vd = self.values.decode(messages.values, messages.nbytes)
        bad: dict[int, str] = dict(vd.bad)
        vrows = np.arange(n, dtype=np.int64) if vd.rows is None else vd.rows
        parts: list[tuple[np.ndarray, Changes]] = []
        if vd.batch is not None and vd.batch.num_rows:
            ch = self._changes(vd.batch)
            for i, e in ch.bad:
                bad[int(vrows[i])] = e
            keep = np.ones(len(vrows), dtype=bool)
            if ch.bad:
                keep[[i for i, _ in ch.bad]] = False
            if ch.bad and keep.any():
                mask = pa.array(keep)
                ch = Changes(
                    ch.rows.filter(mask), ch.ops[keep], {k: v.filter(mask) for k, v in ch.extra.items()}
                )
                vrows = vrows[keep]
            if keep.any():
                if self.row_schema is not None:
                    ch.rows = align(ch.rows, self.row_schema)
                parts.append((vrows, ch))
        nulls = np.fromiter((v is None for v in messages.values), dtype=bool, count=n)
        tomb = np.flatnonzero(nulls) if self.tombstone_deletes else np.zeros(0, dtype=np.int64)
        skipped = int(nulls.sum()) - tomb.size
        if tomb.size:
            schema = parts[0][1].rows.schema if parts else (self.row_schema or pa.schema([]))
            rows = pa.RecordBatch.from_arrays([pa.nulls(tomb.size, f.type) for f in schema], schema=schema)
            parts.append((tomb, Changes(rows, np.full(tomb.size, Op.DELETE, np.int8), self._extra_nulls(tomb.size))))
        if not parts:
            return Decoded(None, np.zeros(0, dtype=np.int64), sorted(bad.items()), skipped)
        msgs = np.concatenate([m for m, _ in parts])
        order = np.argsort(msgs, kind="stable")
        msgs = msgs[order]
        rows_t = pa.Table.from_batches([align(c.rows, parts[0][1].rows.schema) for _, c in parts]).take(order)
        ops = np.concatenate([c.ops for _, c in parts])[order]
        extra = {
            name: pa.chunked_array([c.extra[name].cast(col.type) for _, c in parts]).combine_chunks().take(order)
            for name, col in parts[0][1].extra.items()
        }
        keys, good = self._keys(messages, msgs, rows_t, nulls, bad)
        if not good.any():
            return Decoded(None, np.zeros(0, dtype=np.int64), sorted(bad.items()), skipped)
        names = keys.column_names
        columns: dict[str, pa.Array] = {k: keys.column(k) for k in names}
        columns.update((f.name, rows_t.column(f.name)) for f in rows_t.schema if f.name not in columns)
        columns.update(extra)
        columns[OP] = pa.array(ops, pa.int8())
        columns[ORDER] = pa.array(messages.offsets[msgs], pa.int64())
        table = pa.table(columns)
        if not good.all():
            table, msgs = table.filter(pa.array(good)), msgs[good]
        batch = with_keys(table.combine_chunks().to_batches()[0], names)
        full = msgs.size == n
        return Decoded(batch, None if full else msgs, sorted(bad.items()), skipped)

    def _keys(
        self, messages: Messages, msgs: np.ndarray, rows: pa.Table, nulls: np.ndarray, bad: dict[int, str]
    ) -> tuple[pa.Table, np.ndarray]:
        """The key columns of the changes of ``msgs`` (in that order), and which of them have a whole key;
        the errors of those that do not go into ``bad``."""
        if self.key_columns is None:
            keys, found = self._message_keys(messages, msgs, bad)
        else:  # from the rows; a tombstone's from its message key
            keys = rows.select([c for c in self.key_columns if c in rows.column_names])
            for c in self.key_columns:
                if c not in keys.column_names:
                    keys = keys.append_column(c, pa.nulls(keys.num_rows))
            keys, found = keys.select(self.key_columns), np.ones(msgs.size, dtype=bool)
            tomb = np.flatnonzero(nulls[msgs])
            if tomb.size:
                keys, found = self._tombstone_keys(messages, msgs, tomb, keys, bad)
        good = found.copy()
        for name in keys.column_names:
            null = keys.column(name).is_null().to_numpy(zero_copy_only=False) & good
            for i in np.flatnonzero(null).tolist():
                bad[int(msgs[i])] = f"key column {name!r} is null (a change needs its whole key)"
            good &= ~null
        return keys, good

    def _message_keys(
        self, messages: Messages, msgs: np.ndarray, bad: dict[int, str]
    ) -> tuple[pa.Table, np.ndarray]:
        all_keys = messages.keys()
        kd = self.keys.decode([all_keys[i] for i in msgs.tolist()])
        pos = np.full(msgs.size, -1, dtype=np.int64)
        if kd.batch is not None:
            pos[np.arange(kd.batch.num_rows) if kd.rows is None else kd.rows] = np.arange(kd.batch.num_rows)
        errors = dict(kd.bad)
        for i in np.flatnonzero(pos < 0).tolist():
            bad[int(msgs[i])] = f"message key: {errors[i]}" if i in errors else _NO_KEY
        found = pos >= 0
        if kd.batch is None:
            return pa.table({}), found
        batch = kd.batch
        if self.key_column is not None and batch.num_columns == 1:
            batch = batch.rename_columns([self.key_column])
        keys = pa.Table.from_batches([batch]).take(pa.array(np.where(found, pos, 0)))
        return keys, found

    def _tombstone_keys(
        self, messages: Messages, msgs: np.ndarray, tomb: np.ndarray, keys: pa.Table, bad: dict[int, str]
    ) -> tuple[pa.Table, np.ndarray]:
        """``keys`` with the key columns of the tombstones at ``tomb`` taken from their message keys."""
        assert self.key_columns is not None
        kt, found_t = self._message_keys(messages, msgs[tomb], bad)
        found = np.ones(msgs.size, dtype=bool)
        found[tomb] = found_t
        index = np.arange(msgs.size)
        index[tomb] = msgs.size + np.arange(tomb.size)  # a tombstone's key from its message key
        columns = {}
        for c in self.key_columns:
            typ = keys.column(c).type
            if c in kt.column_names:
                part = kt.column(c)
                typ = part.type if pa.types.is_null(typ) else typ
                part = part.cast(typ)
            else:
                for i in np.flatnonzero(found_t).tolist():
                    bad[int(msgs[tomb[i]])] = f"the message key has no field {c!r} (key_columns)"
                found[tomb] = False
                part = pa.chunked_array([pa.nulls(tomb.size, typ)])
            whole = pa.chunked_array([*keys.column(c).cast(typ).chunks, *part.chunks], typ)
            columns[c] = whole.take(pa.array(index))
        return pa.table(columns), found
