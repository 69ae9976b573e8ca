"""The hashmap backend's bulk snapshot path: a table's canonical rows as Arrow arrays, built from the dict's
keys and values in bulk instead of entry by entry.

It covers states without TTL (value, list and map); the rows (and so the bytes
:class:`~sluice.state.canonical.GroupWriter` writes) are the ones the per-entry path
(:func:`~sluice.state.canonical.entry_rows`) gives, in the same order. Entry keys are split into key and
namespace with NumPy over the Arrow binary array's buffers: a key's width follows from its tag (and the
length of a string or binary key); only tuple keys are measured per entry.
"""

from __future__ import annotations

from itertools import chain
from typing import Any

import numpy as np
import pyarrow as pa

from sluice.state.keycodec import binary_parts, gather_binary, key_widths
from sluice.state.meta import RegisteredState
from sluice.state.serializers import PrimitiveSerializer, StateSerializer

__all__ = ["bulk_rows"]

#: what the bulk encoding of values may raise where the per-entry encoding may not (it then runs instead)
_BULK_ERRORS = (pa.ArrowException, TypeError, ValueError, OverflowError)


def _binary(offsets: np.ndarray, data: bytes | np.ndarray) -> pa.Array:
    """A binary array (no nulls) from int32 offsets and the values' bytes."""
    n = len(offsets) - 1
    return pa.Array.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)]
    )


def _repeated(value: bytes, n: int) -> pa.Array:
    """``value`` ``n`` times, as a binary array."""
    return _binary(np.arange(n + 1, dtype=np.int64) * len(value), value * n)


def split_keys(entries: pa.Array) -> tuple[pa.Array, pa.Array]:
    """The (key, namespace) columns of a binary array of entry keys (``key | u16 length, namespace``)."""
    n = len(entries)
    buf, starts, lengths = binary_parts(entries)
    widths = key_widths(buf, starts, lengths)
    if np.array_equal(widths, lengths):  # no namespaces
        return entries, _binary(np.zeros(n + 1, dtype=np.int64), b"")
    keys = gather_binary(buf, starts, widths)
    ns_lengths = np.maximum(lengths - widths - 2, 0)
    return keys, gather_binary(buf, starts + widths + 2, ns_lengths)


def encode_values(serializer: StateSerializer, values: list[Any]) -> pa.Array:
    """The values as a binary array of their encodings (what ``serializer.encode`` gives each)."""
    if isinstance(serializer, PrimitiveSerializer) and serializer.arrow_type is not None:
        # pyarrow converts a float into an integer column silently (1.5 -> 1) where the per-entry ``struct.pack``
        # refuses it: anything but ints takes the per-entry path, which fails the snapshot as before
        if pa.types.is_integer(serializer.arrow_type) and not set(map(type, values)) <= {int, bool}:
            return pa.array(list(map(serializer.encode, values)), pa.binary())
        try:
            arrow = pa.array(values, serializer.arrow_type)
            if not arrow.null_count:
                return serializer.encode_binary(arrow)
        except _BULK_ERRORS:
            pass
    return pa.array(list(map(serializer.encode, values)), pa.binary())


def bulk_rows(reg: RegisteredState, data: dict[bytes, Any]) -> tuple[pa.Array, ...] | None:
    """The canonical columns ``(key, namespace, user_key, value, expiry)`` of one table's entries, as the
    per-entry path gives them; None for what this path does not cover (states with TTL)."""
    if reg.ttl is not None or not data:
        return None
    entries = pa.array(list(data), pa.binary())
    values = list(data.values())
    user_keys: pa.Array | None = None
    if reg.kind != "value":
        counts = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
        rows = np.repeat(np.arange(len(values), dtype=np.int64), counts)
        if not np.array_equal(rows, np.arange(len(values))):
            entries = entries.take(pa.array(rows))
        if reg.kind == "map":
            assert reg.key_serializer is not None
            user_keys = encode_values(reg.key_serializer, list(chain.from_iterable(values)))
            values = list(chain.from_iterable(m.values() for m in values))
        else:
            values = list(chain.from_iterable(values))
    key, namespace = split_keys(entries)
    n = len(key)
    value = encode_values(reg.serializer, values)
    return key, namespace, user_keys if user_keys is not None else pa.nulls(n, pa.binary()), value, pa.nulls(n, pa.int64())


def state_column(name: str, n: int) -> pa.Array:
    """The ``state`` column: ``name`` ``n`` times."""
    return _repeated(name.encode("utf-8"), n).cast(pa.string())
