"""Columnar Avro decoding: a batch of records decoded field by field with numpy, straight into Arrow arrays.

Avro's binary encoding is sequential within a record, but records are independent, so a batch can be decoded
one *field* at a time for every record at once: each record has a cursor (``pos``), and reading a field
advances all cursors together (varints one byte position at a time over the records still in one, strings
by gathering their bytes).
The Python loop runs per field of the schema, never per record.

Every record is checked to end exactly where its bytes end; a record that runs past its end, has an invalid
union branch, enum index or boolean, or leaves bytes unread is flagged (``bad``) and left out, and the
caller asks fastavro for the precise error. Types outside the plan (arrays, maps, decimals, unions of two
non-null types) return no plan, and the caller decodes with fastavro instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
from sluice.connectors.kafka.errors import UnsupportedSchemaError

__all__ = ["PAD", "ColumnarPlan", "compile_plan"]

#: bytes of zero padding the joined buffer needs after its last record (a varint window, a double)
PAD = 16

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_COUNTING = np.arange(1 << 20, dtype=np.int64)


def _counting(n: int) -> np.ndarray:
    """``np.arange(n)`` without allocating it every time (a read-only view of a shared array)."""
    global _COUNTING
    if n > _COUNTING.size:
        _COUNTING = np.arange(max(n, 2 * _COUNTING.size), dtype=np.int64)
    return _COUNTING[:n]

_Reader = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], pa.Array]


def _varint(buf: np.ndarray, pos: np.ndarray, ends: np.ndarray, bad: np.ndarray) -> np.ndarray:
    """Zig-zag varints at ``pos`` (advanced past them): one gather per byte position, over the records
    whose varint is still going (most are 1-3 bytes long)."""
    b = buf[pos]
    raw = (b & 0x7F).astype(np.uint64)
    pos += 1
    more = np.flatnonzero(b & 0x80)
    shift = 7
    while more.size:
        if shift >= 70:  # longer than the 10 bytes of a 64-bit varint
            bad[more] = True
            break
        b = buf[pos[more]]
        raw[more] |= (b & 0x7F).astype(np.uint64) << np.uint64(shift)
        pos[more] += 1
        more = more[(b & 0x80) != 0]
        shift += 7
    _clamp(pos, ends, bad)
    out: np.ndarray = (raw >> np.uint64(1)).astype(np.int64) ^ -(raw & np.uint64(1)).astype(np.int64)
    return out


def _clamp(pos: np.ndarray, ends: np.ndarray, bad: np.ndarray) -> None:
    over = pos > ends
    if over.any():
        bad |= over
        np.minimum(pos, ends, out=pos)


def _fixed_width(
    buf: np.ndarray, pos: np.ndarray, ends: np.ndarray, bad: np.ndarray, width: int
) -> np.ndarray:
    """``width`` bytes per record at ``pos``, as an (n, width) array."""
    idx = pos[:, None] + np.arange(width, dtype=np.int64)
    if width > PAD:  # a truncated record's window may reach past the padding
        np.minimum(idx, buf.size - 1, out=idx)
    out = buf[idx]
    pos += width
    _clamp(pos, ends, bad)
    return np.ascontiguousarray(out)


def _null(buf: np.ndarray, pos: np.ndarray, ends: np.ndarray, bad: np.ndarray) -> pa.Array:
    return pa.nulls(pos.size)


def _boolean(buf: np.ndarray, pos: np.ndarray, ends: np.ndarray, bad: np.ndarray) -> pa.Array:
    b = _fixed_width(buf, pos, ends, bad, 1).ravel()
    bad |= b > 1
    return pa.array(b == 1, pa.bool_())


def _int(buf: np.ndarray, pos: np.ndarray, ends: np.ndarray, bad: np.ndarray) -> pa.Array:
    v = _varint(buf, pos, ends, bad)
    bad |= (v < _INT32_MIN) | (v > _INT32_MAX)
    return pa.array(v.astype(np.int32), pa.int32())


def _long(buf: np.ndarray, pos: np.ndarray, ends: np.ndarray, bad: np.ndarray) -> pa.Array:
    return pa.array(_varint(buf, pos, ends, bad), pa.int64())


def _float(buf: np.ndarray, pos: np.ndarray, ends: np.ndarray, bad: np.ndarray) -> pa.Array:
    return pa.array(_fixed_width(buf, pos, ends, bad, 4).view("<f4").ravel(), pa.float32())


def _double(buf: np.ndarray, pos: np.ndarray, ends: np.ndarray, bad: np.ndarray) -> pa.Array:
    return pa.array(_fixed_width(buf, pos, ends, bad, 8).view("<f8").ravel(), pa.float64())


def _bytes_like(typ: pa.DataType) -> _Reader:
    def read(buf: np.ndarray, pos: np.ndarray, ends: np.ndarray, bad: np.ndarray) -> pa.Array:
        n = pos.size
        ln = _varint(buf, pos, ends, bad)
        wrong = (ln < 0) | (pos + ln > ends)
        if wrong.any():
            bad |= wrong
            ln[wrong] = 0
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(ln, out=offsets[1:])
        total = int(offsets[-1])
        data = buf[np.repeat(pos - offsets[:-1], ln) + _counting(total)] if total else b""
        pos += ln
        large = total >= 2**31
        physical = (pa.large_string() if typ == pa.string() else pa.large_binary()) if large else typ
        arr = pa.Array.from_buffers(
            physical,
            n,
            [None, pa.py_buffer(offsets if large else offsets.astype(np.int32)), pa.py_buffer(data)],
        )
        if typ == pa.string():
            try:
                arr.validate(full=True)
            except pa.ArrowInvalid:  # invalid UTF-8: flag those records, keep the others
                raw = arr.cast(pa.large_binary() if large else pa.binary()).to_pylist()
                for i, v in enumerate(raw):
                    try:
                        v.decode()
                    except UnicodeDecodeError:
                        bad[i] = True
                arr = pa.array([v.decode("utf-8", "replace") for v in raw], physical)
        return arr.cast(typ) if large else arr

    return read


def _enum(symbols: list[str]) -> _Reader:
    table = pa.array(symbols, pa.string())

    def read(buf: np.ndarray, pos: np.ndarray, ends: np.ndarray, bad: np.ndarray) -> pa.Array:
        idx = _varint(buf, pos, ends, bad)
        wrong = (idx < 0) | (idx >= len(symbols))
        if wrong.any():
            bad |= wrong
            idx[wrong] = 0
        return table.take(pa.array(idx.astype(np.int32)))

    return read


def _fixed(size: int) -> _Reader:
    def read(buf: np.ndarray, pos: np.ndarray, ends: np.ndarray, bad: np.ndarray) -> pa.Array:
        data = _fixed_width(buf, pos, ends, bad, size)
        return pa.Array.from_buffers(pa.binary(size), pos.size, [None, pa.py_buffer(data)])

    return read


def _record(names: list[str], children: list[_Reader]) -> _Reader:
    def read(buf: np.ndarray, pos: np.ndarray, ends: np.ndarray, bad: np.ndarray) -> pa.Array:
        arrays = [child(buf, pos, ends, bad) for child in children]
        return pa.StructArray.from_arrays(arrays, names=names)

    return read


def _nullable(value_branch: int, child: _Reader, typ: pa.DataType) -> _Reader:
    def read(buf: np.ndarray, pos: np.ndarray, ends: np.ndarray, bad: np.ndarray) -> pa.Array:
        branch = _varint(buf, pos, ends, bad)
        bad |= (branch != 0) & (branch != 1)
        present = branch == value_branch
        sub_pos, sub_bad = pos[present], bad[present]
        values = child(buf, sub_pos, ends[present], sub_bad)
        pos[present] = sub_pos
        bad[present] = sub_bad
        if present.all():
            return values
        index = np.zeros(pos.size, dtype=np.int32)
        index[present] = np.arange(int(present.sum()), dtype=np.int32)
        return values.take(pa.array(index, pa.int32(), mask=~present))

    return read


_PRIMITIVES: dict[str, tuple[_Reader, pa.DataType]] = {
    "null": (_null, pa.null()),
    "boolean": (_boolean, pa.bool_()),
    "int": (_int, pa.int32()),
    "long": (_long, pa.int64()),
    "float": (_float, pa.float32()),
    "double": (_double, pa.float64()),
    "bytes": (_bytes_like(pa.binary()), pa.binary()),
    "string": (_bytes_like(pa.string()), pa.string()),
}


class _UnsupportedTypeError(UnsupportedSchemaError):
    """The schema has a type the columnar plan does not cover (fastavro decodes it instead)."""


def _compile(schema: Any) -> tuple[_Reader, pa.DataType]:
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return _PRIMITIVES[schema]
        raise _UnsupportedTypeError(schema)
    if isinstance(schema, list):
        non_null = [i for i, s in enumerate(schema) if s != "null"]
        if len(schema) != 2 or len(non_null) != 1:
            raise _UnsupportedTypeError("union")
        child, typ = _compile(schema[non_null[0]])
        return _nullable(non_null[0], child, typ), typ
    if not isinstance(schema, dict):
        raise _UnsupportedTypeError(repr(schema))
    kind = schema.get("type")
    if "logicalType" in schema and kind not in ("record", "enum", "array", "map"):
        raise _UnsupportedTypeError(schema["logicalType"])  # the caller strips the logical types it casts itself
    if kind == "record":
        compiled = [_compile(f["type"]) for f in schema["fields"]]
        names = [f["name"] for f in schema["fields"]]
        typ = pa.struct([pa.field(n, t) for n, (_, t) in zip(names, compiled, strict=True)])
        return _record(names, [c for c, _ in compiled]), typ
    if kind == "enum":
        return _enum(list(schema["symbols"])), pa.string()
    if kind == "fixed":
        return _fixed(int(schema["size"])), pa.binary(int(schema["size"]))
    if isinstance(kind, str | list | dict) and kind not in ("array", "map"):
        return _compile(kind)
    raise _UnsupportedTypeError(str(kind))


class ColumnarPlan:
    """The compiled decoder of one (parsed, expanded, logical-type-free) Avro record schema."""

    def __init__(self, reader: _Reader, typ: pa.StructType) -> None:
        self._reader = reader
        self.type = typ

    def decode(
        self, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray
    ) -> tuple[pa.StructArray, np.ndarray]:
        """Decode the records at ``buf[starts[i]:ends[i]]`` (``buf`` padded with :data:`PAD` zero bytes).

        Returns:
            The decoded records (garbage in the rows flagged bad) and the mask of bad rows.
        """
        pos = starts.astype(np.int64, copy=True)
        bad = np.zeros(pos.size, dtype=bool)
        arr = self._reader(buf, pos, ends, bad)
        bad |= pos != ends
        return arr, bad


def compile_plan(schema: Any) -> ColumnarPlan | None:
    """The columnar plan of a record schema, or None if it has types the plan does not cover."""
    if not isinstance(schema, dict) or schema.get("type") != "record":
        return None
    try:
        reader, typ = _compile(schema)
    except _UnsupportedTypeError:
        return None
    assert isinstance(typ, pa.StructType)
    return ColumnarPlan(reader, typ)
