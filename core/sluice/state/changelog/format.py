"""What changelog checkpoints write: segment files of changes, their references, and where files go.

A **segment** holds the changes one checkpoint sealed, compacted per entry (each changed entry's value at
the seal, or its deletion), as one Arrow IPC stream (zstd) sorted by key group, so a restore reads only the
key groups it owns:

* RocksDB: ``(kg, key, value)``: the raw storage key and its new value, null for a deletion; timers and
  TTL expiry times are entries like any other.
* hashmap: ``(kg, op, state, key, namespace, user_key, value, expiry)``: canonical rows
  (:mod:`sluice.state.canonical`); ``op`` 0 clears an entry (a timer: that one timer), ``op`` 1 adds a row
  (a value, a list element, a map entry, a timer). A changed entry is a clear and then its rows.

Replaying a segment sets every entry it names to its value at the seal (replaying it twice changes nothing).
The handle of a checkpoint::

    {"backend": "rocksdb" | "hashmap", "format": "changelog", "version": 1, "checkpoint_id": n,
     "key_groups": [start, end], "states": {name: StateMeta},
     "base": {"handle": <native or canonical handle>, "confirmed": bool, "id": str} | None,
     "segments": [{"path", "sha256", "size", "seq", "kgs": [key groups], "placeholder": bool}, ...]}

Every file of a changelog checkpoint is shared (``shared/<owner>/``): counted by the shared-state registry
and deleted when no retained checkpoint references it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sluice.errors import RestoreError
from sluice.state.spi import StatePaths
from sluice.state.transfer import FileRef

__all__ = [
    "FORMAT_VERSION",
    "HEAP_SEGMENT",
    "OP_ADD",
    "OP_CLEAR",
    "ROCKSDB_SEGMENT",
    "ChangelogPaths",
    "SegmentRef",
    "read_segment",
    "write_segment",
]

FORMAT_VERSION = 1
OP_CLEAR = 0
OP_ADD = 1

ROCKSDB_SEGMENT = pa.schema(
    [
        pa.field("kg", pa.uint16(), nullable=False),
        pa.field("key", pa.binary(), nullable=False),
        pa.field("value", pa.binary()),
    ],
    metadata={"sluice.changelog": "rocksdb"},
)
HEAP_SEGMENT = pa.schema(
    [
        pa.field("kg", pa.uint16(), nullable=False),
        pa.field("op", pa.int8(), nullable=False),
        pa.field("state", pa.string(), nullable=False),
        pa.field("key", pa.binary(), nullable=False),
        pa.field("namespace", pa.binary(), nullable=False),
        pa.field("user_key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("expiry", pa.int64()),
    ],
    metadata={"sluice.changelog": "hashmap"},
)
_WRITE = pa.ipc.IpcWriteOptions(compression="zstd")


@dataclass(frozen=True)
class ChangelogPaths(StatePaths):
    """Where a changelog backend's files go: all under ``shared/``, named by this instance's ``token``
    (a materialization's files, which a native snapshot would keep per checkpoint, are shared too)."""

    token: str = ""

    def private(self, checkpoint_id: int, name: str, savepoint: bool = False) -> str:
        if savepoint:
            return super().private(checkpoint_id, name, savepoint)
        return self.shared(f"{self.token}-m{checkpoint_id}-{name}")


@dataclass(frozen=True)
class SegmentRef:
    """An uploaded segment: its file, sequence number and the key groups it has changes for."""

    file: FileRef
    seq: int
    kgs: tuple[int, ...]

    def to_plain(self, placeholder: bool) -> dict[str, Any]:
        """As plain data for a handle."""
        return {**self.file.to_plain(), "seq": self.seq, "kgs": list(self.kgs), "placeholder": placeholder}

    @classmethod
    def from_plain(cls, data: dict[str, Any]) -> SegmentRef:
        """From :meth:`to_plain`'s data."""
        try:
            return cls(FileRef.from_plain(data), int(data["seq"]), tuple(int(k) for k in data["kgs"]))
        except (KeyError, TypeError, ValueError):
            raise RestoreError("a changelog state handle has a malformed segment reference") from None


def write_segment(path: str, rows: pa.Table) -> None:
    """Write a segment's rows as one Arrow IPC stream (zstd)."""
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, rows.schema, options=_WRITE) as writer:
        writer.write_table(rows)


def read_segment(path: str, schema: pa.Schema) -> pa.Table:
    """A segment's rows, checked to have ``schema``."""
    try:
        with pa.OSFile(path, "rb") as source:
            rows = pa.ipc.open_stream(source).read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise RestoreError(f"a changelog segment is malformed: {exc}") from None
    if not rows.schema.equals(schema):
        raise RestoreError(f"a changelog segment has schema {rows.schema}, expected {schema}")
    return rows
