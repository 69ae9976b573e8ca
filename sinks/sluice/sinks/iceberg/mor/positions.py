"""Row positions as the merge-on-read index stores them: a data file's 64-bit id and a row position, packed
into 16 bytes (big-endian: the id, then the position), one value per key in the writers' keyed state.

A file's id is a hash of its absolute path as the table's manifests name it (:func:`file_id`): the index never
holds a path, and the committer maps ids back to paths from the table's live files (a collision among live
files is detected there and refused). Every step works on whole arrays.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pyarrow as pa
from sluice.state.api import ValueStateDescriptor

__all__ = ["INDEX", "file_id", "index_descriptor", "pack", "unpack"]

#: the name of the index's value state
INDEX = "pk_index"
_WIDTH = 16


def index_descriptor() -> ValueStateDescriptor:
    """The index's value state: 16-byte values (``binary``: plain bytes in every backend and savepoint)."""
    return ValueStateDescriptor(INDEX, serializer="binary")


def file_id(path: str) -> int:
    """The 64-bit id (signed) of a data file's absolute path."""
    return int.from_bytes(hashlib.blake2b(path.encode("utf-8"), digest_size=8).digest(), "big", signed=True)


def pack(files: np.ndarray[Any, Any], positions: np.ndarray[Any, Any]) -> pa.Array:
    """``(file id, position)`` pairs as a binary array of 16-byte values."""
    n = len(positions)
    rows = np.empty((n, 2), dtype=">i8")
    rows[:, 0] = files
    rows[:, 1] = positions
    offsets = np.arange(n + 1, dtype=np.int32) * _WIDTH
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(rows.tobytes())])


def unpack(values: pa.Array) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Which values are present, and the file ids and positions of the present ones (in order)."""
    arr = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    if not isinstance(arr, pa.BinaryArray):
        arr = arr.cast(pa.binary())
    present = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    kept = arr.filter(pa.array(present)) if not present.all() else arr
    if len(kept) == 0:
        empty = np.zeros(0, np.int64)
        return present, empty, empty
    _, offsets, data = kept.buffers()
    off = np.frombuffer(offsets, dtype=np.int32)[kept.offset : kept.offset + len(kept) + 1]
    if not np.array_equal(np.diff(off), np.full(len(kept), _WIDTH)):
        raise ValueError("the merge-on-read index holds a value that is not a 16-byte position")
    raw = np.frombuffer(data, dtype=np.uint8)[off[0] : off[-1]]
    pairs = raw.view(">i8").reshape(-1, 2).astype(np.int64)
    return present, pairs[:, 0].copy(), pairs[:, 1].copy()
