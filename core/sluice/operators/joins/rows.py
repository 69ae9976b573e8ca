"""The table side of ``join_latest`` in keyed state: each key's row as one binary value, encoded and decoded
for a whole batch at once with NumPy (one state read per fact batch, one write per table batch).

A row's bytes (integers little-endian)::

    u32 schema id | null bitmap (a bit per column, least significant first) | the fixed-width columns'
    values | a u32 length per variable-width column | the variable-width columns' bytes, in column order

Fixed-width columns (integers, floats, timestamps, dates, times, durations, decimals, fixed-size binary) are
their Arrow values' bytes, bool one byte; string and binary columns their bytes; any other type (lists,
structs, maps, dictionaries) one Arrow IPC message per value, the only part that runs Python per row. The
schema id (the first 4 bytes of the SHA-256 of the columns' Arrow schema) names the schema a row was
written with: the operator keeps every such schema in its operator state, and a row of an earlier schema
is read by column name (a column it lacks is null, a column whose type changed is cast).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa

from sluice.errors import ConfigError, RestoreError

__all__ = ["RowCodec", "decode_rows"]

_ID = 4  # bytes of the schema id


def _fixed_width(t: pa.DataType) -> int:
    """Bytes per value of a fixed-width type (0: not fixed-width)."""
    if pa.types.is_boolean(t):
        return 1
    if pa.types.is_primitive(t) or pa.types.is_decimal(t) or pa.types.is_fixed_size_binary(t):
        return int(t.bit_width) // 8
    return 0


def _plain_bytes(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t))


def _valid(a: pa.Array) -> np.ndarray:
    if not a.null_count:
        return np.ones(len(a), bool)
    return np.asarray(a.is_valid().to_numpy(zero_copy_only=False), bool)


def _bits(mask: np.ndarray) -> pa.Buffer | None:
    """A validity (or bool data) bitmap of ``mask``; None for an all-true validity."""
    return None if mask.all() else pa.py_buffer(np.packbits(mask, bitorder="little"))


def _spans(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``data[starts[i] : starts[i] + lengths[i]]`` for every ``i``, concatenated."""
    total = int(lengths.sum())
    if not total:
        return np.zeros(0, np.uint8)
    first = np.cumsum(lengths) - lengths
    return data[np.repeat(starts - first, lengths) + np.arange(total)]


def _binary_parts(a: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The offsets (``len(a) + 1``, int64, from 0) and the value bytes of a string or binary array."""
    n = len(a)
    bufs = a.buffers()
    wide = pa.types.is_large_string(a.type) or pa.types.is_large_binary(a.type)
    offs = np.frombuffer(bufs[1], np.int64 if wide else np.int32)[a.offset : a.offset + n + 1].astype(np.int64)
    raw = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    return offs - offs[0], raw[offs[0] : offs[-1]]


class RowCodec:
    """Rows of one schema (the table's columns but its key) as binary values, a whole batch at a time.

    Attributes:
        schema: the columns (without metadata).
        id: the schema id written at the start of every row.
    """

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = pa.schema([pa.field(f.name, f.type) for f in schema])
        self.id = int.from_bytes(hashlib.sha256(self.schema.serialize().to_pybytes()).digest()[:_ID], "little")
        self._nbits = (len(self.schema) + 7) // 8
        self._fixed: list[tuple[int, int, int]] = []  # (column, offset in the row, width)
        self._var: list[int] = []  # columns stored as a length and their bytes
        at = _ID + self._nbits
        for i, f in enumerate(self.schema):
            if w := _fixed_width(f.type):
                self._fixed.append((i, at, w))
                at += w
            else:
                self._var.append(i)
        self._lengths = at
        self.header = at + 4 * len(self._var)

    # -- encoding ---------------------------------------------------------------------------------------
    def encode(self, rows: pa.Table | pa.RecordBatch) -> pa.Array:
        """Every row of ``rows`` (which has this schema's columns, by name) as one ``large_binary`` value."""
        n = rows.num_rows
        cols = []
        for f in self.schema:
            c = rows.column(f.name)
            c = c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c
            cols.append(c if c.type == f.type else c.cast(f.type))
        head = np.zeros((n, self.header), np.uint8)
        head[:, :_ID] = np.frombuffer(self.id.to_bytes(_ID, "little"), np.uint8)
        if cols:
            head[:, _ID : _ID + self._nbits] = np.packbits(~np.stack([_valid(c) for c in cols], axis=1), axis=1, bitorder="little")
        for i, at, w in self._fixed:
            head[:, at : at + w] = self._fixed_bytes(cols[i], w)
        lengths = np.zeros((n, len(self._var)), np.int64)
        parts = []
        for j, i in enumerate(self._var):
            offs, raw = self._var_bytes(cols[i])
            lengths[:, j] = np.diff(offs)
            parts.append(raw)
        head[:, self._lengths :] = lengths.astype("<u4").view(np.uint8).reshape(n, 4 * len(self._var))
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(self.header + lengths.sum(axis=1), out=offsets[1:])
        out = np.empty(int(offsets[-1]), np.uint8)
        starts = offsets[:-1]
        out[(starts[:, None] + np.arange(self.header)).ravel()] = head.ravel()
        at_row = starts + self.header
        for j, raw in enumerate(parts):
            ln = lengths[:, j]
            if len(raw):
                out[np.repeat(at_row - (np.cumsum(ln) - ln), ln) + np.arange(len(raw))] = raw
            at_row = at_row + ln
        return pa.Array.from_buffers(pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(out)])

    @staticmethod
    def _fixed_bytes(c: pa.Array, w: int) -> np.ndarray:
        n = len(c)
        if pa.types.is_boolean(c.type):
            return np.asarray(c.fill_null(False).to_numpy(zero_copy_only=False), np.uint8).reshape(n, 1)
        buf = c.buffers()[1]
        if buf is None or not n:
            return np.zeros((n, w), np.uint8)
        return np.frombuffer(buf, np.uint8)[c.offset * w : (c.offset + n) * w].reshape(n, w)

    @staticmethod
    def _var_bytes(c: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        if not len(c):
            return np.zeros(1, np.int64), np.zeros(0, np.uint8)
        if _plain_bytes(c.type):
            return _binary_parts(c)
        schema = pa.schema([pa.field("v", c.type)])
        blobs = [
            pa.record_batch([c.slice(i, 1)], schema=schema).serialize().to_pybytes() if c[i].is_valid else b""
            for i in range(len(c))
        ]  # fmt: skip
        offs = np.zeros(len(c) + 1, np.int64)
        np.cumsum([len(b) for b in blobs], out=offs[1:])
        return offs, np.frombuffer(b"".join(blobs), np.uint8)

    # -- decoding ---------------------------------------------------------------------------------------
    def decode(self, data: np.ndarray, starts: np.ndarray) -> list[pa.Array]:
        """The columns of the rows starting at ``starts`` in ``data`` (rows written with this schema)."""
        m = len(starts)
        head = data[starts[:, None] + np.arange(self.header)] if m else np.zeros((0, self.header), np.uint8)
        valid = ~np.unpackbits(head[:, _ID : _ID + self._nbits], axis=1, count=len(self.schema), bitorder="little").astype(bool)
        out: list[pa.Array] = [pa.nulls(0)] * len(self.schema)
        for i, at, w in self._fixed:
            t = self.schema.field(i).type
            raw = np.ascontiguousarray(head[:, at : at + w])
            body = pa.py_buffer(np.packbits(raw[:, 0] != 0, bitorder="little")) if pa.types.is_boolean(t) else pa.py_buffer(raw)
            out[i] = pa.Array.from_buffers(t, m, [_bits(valid[:, i]), body])
        lengths = np.ascontiguousarray(head[:, self._lengths :]).view("<u4").astype(np.int64)
        at_row = starts + self.header
        for j, i in enumerate(self._var):
            t, ln = self.schema.field(i).type, lengths[:, j]
            raw = _spans(data, at_row, ln)
            at_row = at_row + ln
            if _plain_bytes(t):
                offs = np.zeros(m + 1, np.int64)
                np.cumsum(ln, out=offs[1:])
                wide = pa.types.is_large_string(t) or pa.types.is_large_binary(t) or offs[-1] >= 2**31
                kind = t if not wide or pa.types.is_large_string(t) or pa.types.is_large_binary(t) else (
                    pa.large_string() if pa.types.is_string(t) else pa.large_binary()
                )  # fmt: skip
                arr = pa.Array.from_buffers(
                    kind, m, [_bits(valid[:, i]), pa.py_buffer(offs if wide else offs.astype(np.int32)), pa.py_buffer(raw)]
                )  # fmt: skip
                out[i] = arr if kind == t else arr.cast(t)
            else:
                out[i] = self._ipc_values(t, raw, ln, valid[:, i])
        return out

    @staticmethod
    def _ipc_values(t: pa.DataType, raw: np.ndarray, lengths: np.ndarray, valid: np.ndarray) -> pa.Array:
        schema, buf = pa.schema([pa.field("v", t)]), pa.py_buffer(raw)
        at = np.cumsum(lengths) - lengths
        values = [
            pa.ipc.read_record_batch(buf.slice(int(a), int(n)), schema).column(0) if ok else pa.nulls(1, t)
            for a, n, ok in zip(at.tolist(), lengths.tolist(), valid.tolist(), strict=True)
        ]  # fmt: skip
        return pa.concat_arrays(values) if values else pa.array([], t)


def _conform(columns: Sequence[pa.Array], old: pa.Schema, new: pa.Schema, operator: str) -> list[pa.Array]:
    """Columns of an earlier schema as ``new``'s: by name, a missing one null, a changed type cast."""
    m = len(columns[0]) if columns else 0
    by_name = {f.name: c for f, c in zip(old, columns, strict=True)}
    out = []
    for f in new:
        c = by_name.get(f.name)
        if c is None:
            out.append(pa.nulls(m, f.type))
            continue
        try:
            out.append(c if c.type == f.type else c.cast(f.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise ConfigError(
                f"join_latest {operator!r}: table column {f.name!r} was {c.type} in state and is {f.type} now, "
                f"which it cannot be converted to ({exc}); give the column its old type or a new name"
            ) from None
    return out


def decode_rows(values: pa.Array, codecs: Mapping[int, RowCodec], current: RowCodec, operator: str) -> list[pa.Array]:
    """The table rows in ``values`` (binary, null where a key has no row) as ``current``'s columns (a null
    value gives a row of nulls)."""
    n = len(values)
    ok = _valid(values)
    rows = np.flatnonzero(ok)
    offs, data = _binary_parts(values) if n else (np.zeros(1, np.int64), np.zeros(0, np.uint8))
    starts = offs[:-1][rows]
    ids = data[starts[:, None] + np.arange(_ID)].view("<u4").ravel() if len(rows) else np.zeros(0, np.uint32)
    pieces: list[tuple[np.ndarray, list[pa.Array]]] = []
    for sid in np.unique(ids).tolist():
        codec = codecs.get(int(sid))
        if codec is None:
            raise RestoreError(
                f"join_latest {operator!r}: a table row in state was written with a schema this job does not "
                "know (its operator state is missing); restore the checkpoint the keyed state came from"
            )
        sel = ids == sid
        part = rows if sel.all() else rows[sel]
        cols = codec.decode(data, offs[part])
        pieces.append((part, cols if codec is current else _conform(cols, codec.schema, current.schema, operator)))
    if len(pieces) == 1 and len(rows) == n:
        return pieces[0][1]
    where = np.full(n, -1, np.int64)
    at = 0
    for part, _ in pieces:
        where[part] = np.arange(at, at + len(part))
        at += len(part)
    index = pa.array(where, mask=where < 0)
    out = []
    for i, f in enumerate(current.schema):
        chunks = [cols[i] for _, cols in pieces]
        out.append((pa.concat_arrays(chunks) if chunks else pa.array([], f.type)).take(index))
    return out
