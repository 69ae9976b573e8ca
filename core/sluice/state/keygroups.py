"""Keys -> stable hash -> key group -> subtask.

The hash is stable across processes and Python versions (never ``hash()``): integers are mixed with
splitmix64 in NumPy, other values hashed once per distinct value with BLAKE2b, so a batch costs one pass
in C plus one Python call per *distinct* key.

A key hashes the same whatever batch it comes in, as its encoding in state does (:mod:`sluice.state.keycodec`):
timestamps as their microseconds since the epoch whatever the column's unit (the precision the encoding
keeps), dates as their days, with or without nulls beside them in the batch; and a key's Python value
(:func:`key_group_of`) hashes as its column does. Otherwise one key would fall in two key groups: two
entries in state, and a duplicate let through or a join missed.
"""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice.state.keycodec import epoch_micros, null_mask

__all__ = [
    "DEFAULT_MAX_PARALLELISM",
    "KeyGroupRange",
    "hash_values",
    "key_group_of",
    "key_group_range",
    "key_groups",
    "subtask_for_key_groups",
]

DEFAULT_MAX_PARALLELISM = 128

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _splitmix(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64, copy=False) + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


_EPOCH = datetime.datetime(1970, 1, 1)
_EPOCH_UTC = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_EPOCH_DATE = datetime.date(1970, 1, 1)
_MICROSECOND = datetime.timedelta(microseconds=1)


def _hash_scalar(value: object) -> int:
    if value is None:  # as a null in a column
        return 0
    if isinstance(value, bool):
        data = repr(value).encode()
    elif isinstance(value, int):
        return int(_splitmix(np.array([value & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))[0])
    elif isinstance(value, datetime.datetime):  # as its column hashes: microseconds since the epoch
        return _hash_scalar((value - (_EPOCH if value.tzinfo is None else _EPOCH_UTC)) // _MICROSECOND)
    elif isinstance(value, datetime.date):  # days since the epoch
        return _hash_scalar((value - _EPOCH_DATE).days)
    elif isinstance(value, float):  # -0.0 is 0.0, as in the key's encoding
        data = repr(value + 0.0).encode()
    elif isinstance(value, bytes):
        data = value
    elif isinstance(value, str):
        data = value.encode("utf-8")
    else:
        data = repr(value).encode("utf-8")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def _as_ints(column: pa.Array) -> np.ndarray | None:
    """The int64 values a column of ints, timestamps (microseconds since the epoch, whatever the unit) or dates
    (days) hashes as, nulls as 0; None for other columns."""
    t = column.type
    if pa.types.is_timestamp(t):
        return epoch_micros(column)
    if pa.types.is_integer(t):
        ints = column
    elif pa.types.is_date64(t):
        ints = column.cast(pa.int64())
    elif pa.types.is_date32(t):
        ints = column.cast(pa.int32())
    else:
        return None
    if ints.null_count:
        ints = ints.fill_null(0)
    out = np.asarray(ints.to_numpy(zero_copy_only=False)).astype(np.int64, copy=False)
    return out // 86_400_000 if pa.types.is_date64(t) else out  # date64: milliseconds of whole days


def hash_values(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Stable 64-bit hashes of every value of ``column`` (a NumPy uint64 array); a null hashes as 0."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    ints = _as_ints(column)
    if ints is not None:
        out = _splitmix(ints.view(np.uint64))
        if column.null_count:
            out[null_mask(column)] = 0
        return out
    encoded = pc.dictionary_encode(column)
    uniques = np.array([_hash_scalar(v) for v in encoded.dictionary.to_pylist()], dtype=np.uint64)
    indices = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False)
    out = np.where(indices >= 0, uniques[np.maximum(indices, 0)] if len(uniques) else 0, np.uint64(0))
    return out.astype(np.uint64)


def hash_columns(columns: Sequence[pa.Array]) -> np.ndarray:
    """Stable hashes of rows over several key columns."""
    h = hash_values(columns[0])
    for col in columns[1:]:
        with np.errstate(over="ignore"):
            h = _splitmix(h * np.uint64(1000003) ^ hash_values(col))
    return h


def key_groups(hashes: np.ndarray, max_parallelism: int) -> np.ndarray:
    """Key group of every hash (an int64 NumPy array)."""
    return (hashes % np.uint64(max_parallelism)).astype(np.int64)


def key_group_of(key: object, max_parallelism: int) -> int:
    """Key group of one key value, a tuple for a key of several columns (the same as :func:`hash_columns`
    and :func:`key_groups` give for the key's columns)."""
    if not isinstance(key, tuple):
        return _hash_scalar(key) % max_parallelism
    h = np.array([_hash_scalar(key[0])], np.uint64)
    for v in key[1:]:
        with np.errstate(over="ignore"):
            h = _splitmix(h * np.uint64(1000003) ^ np.array([_hash_scalar(v)], np.uint64))
    return int(h[0]) % max_parallelism


def subtask_for_key_groups(groups: np.ndarray, max_parallelism: int, parallelism: int) -> np.ndarray:
    """Subtask index owning each key group (Flink's contiguous ranges)."""
    return (groups * parallelism) // max_parallelism


class KeyGroupRange:
    """The contiguous key groups ``[start, end)`` a subtask owns."""

    __slots__ = ("end", "start")

    def __init__(self, start: int, end: int) -> None:
        self.start = start
        self.end = end

    def __contains__(self, kg: object) -> bool:
        return isinstance(kg, int) and self.start <= kg < self.end

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(range(self.start, self.end))

    def __len__(self) -> int:
        return self.end - self.start

    def __repr__(self) -> str:
        return f"KeyGroupRange({self.start}, {self.end})"


def key_group_range(max_parallelism: int, parallelism: int, index: int) -> KeyGroupRange:
    """Key groups owned by subtask ``index`` of ``parallelism`` (inverse of :func:`subtask_for_key_groups`)."""
    start = (index * max_parallelism + parallelism - 1) // parallelism
    end = ((index + 1) * max_parallelism + parallelism - 1) // parallelism
    return KeyGroupRange(start, min(end, max_parallelism))
