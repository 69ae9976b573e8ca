"""Stable bytes for keys, and the layout of state entries: ``key group | state | key | namespace | user key``.

A key (one column's value, or a tuple of several columns' values) is encoded self-delimiting, tag first,
the same way from a Python value (per-key access: what ``key_by`` hands a function) and from Arrow arrays
(batch-wise access), and decodes back to the Python value (timers give their key back):

=========  ===========================================================
tag        encoding
=========  ===========================================================
``0x00``   null
``0x01``   bool: one byte
``0x02``   int64: 8 bytes big-endian, sign bit flipped (sorts as numbers)
``0x0a``   uint64 values >= 2**63: 8 bytes big-endian
``0x03``   float64: 8 bytes, sortable (-0.0 as 0.0, one NaN)
``0x04``   string: u32 length, UTF-8
``0x05``   binary: u32 length, bytes
``0x06``   timestamp: u8 zone length, zone name, int64 microseconds (sortable; below a microsecond dropped)
``0x07``   date: int32 days (sortable)
``0x08``   tuple (several key columns): u8 count, then each value
=========  ===========================================================

A state entry's storage key is ``key group (u16) | u8 name length, name | key | u16 namespace length,
namespace | user key`` (the user key is a map state's entry key; empty otherwise).
"""

from __future__ import annotations

import datetime
import math
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from sluice.errors import ConfigError

__all__ = [
    "binary_parts",
    "decode_key",
    "encode_key",
    "encode_keys",
    "encode_keys_fixed",
    "gather_binary",
    "key_end",
    "key_widths",
    "rows_as_bytes",
    "split_entry",
    "state_id",
    "state_prefix",
]

_I64 = struct.Struct(">Q")
_F64 = struct.Struct(">d")
_I32 = struct.Struct(">I")
_SIGN = 1 << 63
_EPOCH = datetime.datetime(1970, 1, 1)
_EPOCH_DATE = datetime.date(1970, 1, 1)
_SUPPORTED = "int, float, bool, string, binary, date or timestamp (or a tuple of them)"


def _f64(value: float) -> bytes:
    if value == 0:
        value = 0.0
    elif math.isnan(value):
        value = math.nan
    bits: int = _I64.unpack(_F64.pack(value))[0]
    return _I64.pack(bits ^ 0xFFFFFFFFFFFFFFFF if bits & _SIGN else bits | _SIGN)


def _int(value: int) -> bytes:
    if -_SIGN <= value < _SIGN:
        return b"\x02" + _I64.pack((value + _SIGN) & 0xFFFFFFFFFFFFFFFF)
    if _SIGN <= value < 1 << 64:
        return b"\x0a" + _I64.pack(value)
    raise ConfigError(f"state key {value} does not fit 64 bits")


def _timestamp(value: datetime.datetime) -> bytes:
    if value.tzinfo is None:
        delta = value - _EPOCH
        zone = b""
    else:
        delta = value.astimezone(datetime.UTC).replace(tzinfo=None) - _EPOCH
        zone = _zone_name(value).encode()
    micros = (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds
    return b"\x06" + bytes([len(zone)]) + zone + _I64.pack((micros + _SIGN) & 0xFFFFFFFFFFFFFFFF)


def _zone_name(value: datetime.datetime) -> str:
    zone = value.tzinfo
    if isinstance(zone, datetime.timezone):
        offset = zone.utcoffset(None)
        if not offset:
            return "UTC"
        minutes = int(offset.total_seconds()) // 60
        return f"{'+' if minutes >= 0 else '-'}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"
    return str(getattr(zone, "key", zone))


def encode_key(key: Any) -> bytes:
    """The stable bytes of one key value (a tuple for a key of several columns)."""
    if key is None:
        return b"\x00"
    t = type(key)
    if t is int:
        return _int(key)
    if isinstance(key, str):
        b = key.encode("utf-8")
        return b"\x04" + _I32.pack(len(b)) + b
    if isinstance(key, bytes):
        return b"\x05" + _I32.pack(len(key)) + key
    if t is bool:
        return b"\x01\x01" if key else b"\x01\x00"
    if t is float:
        return b"\x03" + _f64(key)
    if t is tuple:
        if len(key) > 255:
            raise ConfigError("a state key has at most 255 columns")
        return b"\x08" + bytes([len(key)]) + b"".join(encode_key(k) for k in key)
    if isinstance(key, datetime.datetime):
        return _timestamp(key)
    if isinstance(key, datetime.date):
        return b"\x07" + _I32.pack(((key - _EPOCH_DATE).days + (1 << 31)) & 0xFFFFFFFF)
    if isinstance(key, np.generic):
        return encode_key(key.item())
    raise ConfigError(
        f"a state key of type {t.__name__} cannot be stored: key_by a column of {_SUPPORTED} type"
    )


def key_end(data: bytes, at: int = 0) -> int:
    """Where the key encoded at ``data[at:]`` ends."""
    tag = data[at]
    if tag == 0:
        return at + 1
    if tag == 1:
        return at + 2
    if tag in (2, 3, 10):
        return at + 9
    if tag in (4, 5):
        size: int = _I32.unpack_from(data, at + 1)[0]
        return at + 5 + size
    if tag == 6:
        return at + 10 + data[at + 1]
    if tag == 7:
        return at + 5
    if tag == 8:
        end = at + 2
        for _ in range(data[at + 1]):
            end = key_end(data, end)
        return end
    raise ValueError(f"not an encoded state key (tag {tag})")


#: the width of a key by its tag, for the tags whose keys have one width (0 for the others)
_WIDTH = np.zeros(256, dtype=np.int64)
_WIDTH[[0, 1, 2, 3, 7, 10]] = [1, 2, 9, 9, 5, 9]


def binary_parts(values: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A binary array (no nulls) as NumPy: its bytes (uint8), and each value's start and length in them."""
    n = len(values)
    _, offsets_buf, data_buf = values.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int32)[values.offset : values.offset + n + 1].astype(np.int64)
    buf = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return buf, offsets[:-1], np.diff(offsets)


def key_widths(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """:func:`key_end` of many byte strings at once: the width of the key encoded at the front of each
    ``buf[starts[i] : starts[i] + lengths[i]]``, from its tag (and a string's or binary's length) with NumPy;
    only tuple keys are measured one by one."""
    tags = buf[starts]
    widths: np.ndarray = _WIDTH[tags]
    sized = np.flatnonzero((tags == 4) | (tags == 5))  # string, binary: u32 length after the tag
    if len(sized):
        at = starts[sized]
        size = (buf[at + 1].astype(np.int64) << 24) | (buf[at + 2].astype(np.int64) << 16)
        widths[sized] = 5 + (size | (buf[at + 3].astype(np.int64) << 8) | buf[at + 4])
    zoned = np.flatnonzero(tags == 6)  # timestamp: u8 zone length, zone, int64
    if len(zoned):
        widths[zoned] = 10 + buf[starts[zoned] + 1].astype(np.int64)
    for i in np.flatnonzero(widths == 0).tolist():  # tuples
        widths[i] = key_end(buf[starts[i] : starts[i] + lengths[i]].tobytes())
    return widths


def gather_binary(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """The byte ranges ``buf[starts[i] : starts[i] + lengths[i]]`` as a binary array."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    index = np.arange(total, dtype=np.int64) + np.repeat(starts - offsets[:-1], lengths)
    data = buf[index] if total else np.zeros(0, np.uint8)
    return pa.Array.from_buffers(
        pa.binary(), len(lengths), [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)]
    )


def _decode(data: bytes, at: int) -> tuple[Any, int]:
    tag = data[at]
    end = key_end(data, at)
    if tag == 0:
        return None, end
    if tag == 1:
        return data[at + 1] == 1, end
    if tag == 2:
        return _I64.unpack_from(data, at + 1)[0] - _SIGN, end
    if tag == 10:
        return _I64.unpack_from(data, at + 1)[0], end
    if tag == 3:
        (bits,) = _I64.unpack_from(data, at + 1)
        bits = bits ^ _SIGN if bits & _SIGN else bits ^ 0xFFFFFFFFFFFFFFFF
        return _F64.unpack(_I64.pack(bits))[0], end
    if tag == 4:
        return data[at + 5 : end].decode("utf-8"), end
    if tag == 5:
        return data[at + 5 : end], end
    if tag == 6:
        n = data[at + 1]
        zone = data[at + 2 : at + 2 + n].decode()
        micros = _I64.unpack_from(data, at + 2 + n)[0] - _SIGN
        return pa.scalar(micros, pa.timestamp("us", zone or None)).as_py(), end
    if tag == 7:
        days = _I32.unpack_from(data, at + 1)[0] - (1 << 31)
        return _EPOCH_DATE + datetime.timedelta(days=days), end
    items, pos = [], at + 2
    for _ in range(data[at + 1]):
        item, pos = _decode(data, pos)
        items.append(item)
    return tuple(items), end


def decode_key(data: bytes) -> Any:
    """The key value :func:`encode_key` encoded in ``data``."""
    return _decode(data, 0)[0]


def _fixed_column(column: pa.Array) -> np.ndarray | None:
    """The encoded keys of a column whose encodings all have one width, as an ``(n, width)`` uint8 matrix (None
    for other columns): ints (not uint64), floats, bools and dates without nulls."""
    t = column.type
    if column.null_count or not (
        (pa.types.is_integer(t) and not pa.types.is_uint64(t)) or pa.types.is_floating(t)
        or pa.types.is_boolean(t) or pa.types.is_date32(t)
    ):  # fmt: skip
        return None
    n = len(column)
    if pa.types.is_boolean(t):
        rows = np.empty((n, 2), dtype=np.uint8)
        rows[:, 0] = 1
        rows[:, 1] = np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.uint8)
        return rows
    if pa.types.is_date32(t):
        days = np.asarray(column.cast(pa.int32()).to_numpy(zero_copy_only=False), dtype=np.int64)
        rows = np.empty((n, 5), dtype=np.uint8)
        rows[:, 0] = 7
        rows[:, 1:] = ((days + (1 << 31)) & 0xFFFFFFFF).astype(">u4").view(np.uint8).reshape(-1, 4)
        return rows
    if pa.types.is_floating(t):
        floats = np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float64) + 0.0  # -0.0 -> 0.0
        floats[np.isnan(floats)] = math.nan  # one NaN
        bits = floats.view(np.uint64)
        bits = np.where(bits & np.uint64(_SIGN), ~bits, bits | np.uint64(_SIGN))
        tag = 3
    else:
        bits = np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.int64).view(np.uint64) ^ np.uint64(_SIGN)
        tag = 2
    rows = np.empty((n, 9), dtype=np.uint8)
    rows[:, 0] = tag
    rows[:, 1:] = bits.astype(">u8").view(np.uint8).reshape(-1, 8)
    return rows


def encode_keys_fixed(columns: Sequence[pa.Array | pa.ChunkedArray]) -> np.ndarray | None:
    """The stable bytes of every row's key (as :func:`encode_keys`) as an ``(n, width)`` uint8 matrix, when
    every key has the same width (key columns of ints, floats, bools or dates without nulls); else None.

    Batch-wise access builds storage keys from it with NumPy instead of per key in Python."""
    arrays = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in columns]
    if len(arrays) > 255:
        raise ConfigError("a state key has at most 255 columns")
    parts = []
    for a in arrays:
        fixed = _fixed_column(a.dictionary_decode() if pa.types.is_dictionary(a.type) else a)
        if fixed is None:
            return None
        parts.append(fixed)
    if len(parts) == 1:
        return parts[0]
    head = np.empty((len(arrays[0]), 2), dtype=np.uint8)
    head[:, 0] = 8
    head[:, 1] = len(arrays)
    return np.concatenate([head, *parts], axis=1)


def rows_as_bytes(rows: np.ndarray) -> list[bytes]:
    """Each row of a uint8 matrix as bytes (trailing zero bytes kept)."""
    if not rows.shape[0]:
        return []
    return np.ascontiguousarray(rows).view(f"V{rows.shape[1]}").ravel().tolist()


def null_mask(column: pa.Array) -> np.ndarray:
    """Which values of ``column`` are null (a NumPy bool array)."""
    return np.asarray(column.is_null().to_numpy(zero_copy_only=False), dtype=bool)


def epoch_micros(column: pa.Array) -> np.ndarray:
    """The microseconds since the epoch of a timestamp column's values, whatever its unit (nanoseconds
    floored, as a Python datetime keeps them), nulls as 0: what a timestamp key is encoded and hashed as."""
    t = column.type
    ints = column.cast(pa.int64())
    if ints.null_count:
        ints = ints.fill_null(0)
    out = np.asarray(ints.to_numpy(zero_copy_only=False)).astype(np.int64, copy=False)
    if t.unit == "us":
        return out
    mul, div = {"s": (1_000_000, 1), "ms": (1000, 1), "ns": (1, 1000)}[t.unit]
    with np.errstate(over="ignore"):
        return out * mul // div


def _encode_timestamps(column: pa.Array) -> list[bytes]:
    """:func:`encode_key` of each value of a timestamp column, without a Python datetime per value (which
    a nanosecond that is not a whole microsecond cannot become without pandas)."""
    zone = pa.scalar(0, pa.timestamp("s", column.type.tz)).as_py() if column.type.tz else None
    head = b"\x06" + (b"\x00" if zone is None else bytes([len(name := _zone_name(zone).encode())]) + name)
    micros = (epoch_micros(column).view(np.uint64) + np.uint64(_SIGN)).astype(">u8")
    rows = np.empty((len(column), len(head) + 8), dtype=np.uint8)
    rows[:, : len(head)] = np.frombuffer(head, dtype=np.uint8)
    rows[:, len(head) :] = micros.view(np.uint8).reshape(-1, 8)
    out = rows_as_bytes(rows)
    if column.null_count:
        for i in np.flatnonzero(null_mask(column)).tolist():
            out[i] = b"\x00"
    return out


def _encode_column(column: pa.Array) -> list[bytes]:
    t = column.type
    fixed = _fixed_column(column)
    if fixed is not None:
        return rows_as_bytes(fixed)
    if pa.types.is_timestamp(t):
        return _encode_timestamps(column)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        tag = b"\x04" if pa.types.is_string(t) or pa.types.is_large_string(t) else b"\x05"
        raw_values = column.cast(pa.large_binary()).to_pylist()
        return [b"\x00" if v is None else tag + _I32.pack(len(v)) + v for v in raw_values]
    if pa.types.is_dictionary(t):
        return _encode_column(column.dictionary_decode())
    return [encode_key(v) for v in column.to_pylist()]


def encode_keys(columns: Sequence[pa.Array | pa.ChunkedArray]) -> list[bytes]:
    """The stable bytes of every row's key over one or more key columns (as :func:`encode_key` of the
    row's value, or of the tuple of its values)."""
    arrays = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in columns]
    if len(arrays) == 1:
        return _encode_column(arrays[0])
    if len(arrays) > 255:
        raise ConfigError("a state key has at most 255 columns")
    head = b"\x08" + bytes([len(arrays)])
    parts = [_encode_column(a) for a in arrays]
    return [head + b"".join(row) for row in zip(*parts, strict=True)]


def state_id(name: str) -> bytes:
    """A state's part of its entries' storage keys: its name, length-prefixed."""
    raw = name.encode("utf-8")
    if not raw or len(raw) > 255:
        raise ConfigError(f"state name {name!r} must have 1 to 255 bytes in UTF-8")
    return bytes([len(raw)]) + raw


def state_prefix(key_group: int, sid: bytes) -> bytes:
    """The storage-key prefix of one state's entries in one key group."""
    return key_group.to_bytes(2, "big") + sid


def namespace_part(namespace: bytes) -> bytes:
    """A namespace as it follows the key in a storage key (length-prefixed)."""
    return len(namespace).to_bytes(2, "big") + namespace


def split_entry(entry: bytes) -> tuple[int, str, bytes, bytes, bytes]:
    """A storage key's (key group, state name, key, namespace, user key)."""
    kg = int.from_bytes(entry[:2], "big")
    n = entry[2]
    name = entry[3 : 3 + n].decode("utf-8")
    end = key_end(entry, 3 + n)
    ns_len = int.from_bytes(entry[end : end + 2], "big")
    return kg, name, entry[3 + n : end], entry[end + 2 : end + 2 + ns_len], entry[end + 2 + ns_len :]
