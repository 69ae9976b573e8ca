"""The canonical keyed-state format: what savepoints (and the hashmap backend's checkpoints) hold, and what
either backend restores, so a job can switch backends through a savepoint.

Per key group one Arrow IPC stream of rows ``(state, key, namespace, user_key, value, expiry)``: the
encoded key (:mod:`sluice.state.keycodec`), the namespace, a map entry's key (null otherwise), the value
bytes by the state's serializer (one row per list element, per map entry; a timer's timestamp as 8
big-endian bytes), and the expiry time in ms of a value with TTL (else null). The handle::

    {"backend": "hashmap" | "rocksdb", "format": "canonical", "version": 1, "key_groups": [start, end],
     "states": {name: StateMeta}, "groups": {key_group: bytes}}  # or "files": {key_group: FileRef}

Inline ``groups`` are raw sections of the signed task state file; ``files`` carry their SHA-256, checked
before they are read.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from sluice.errors import RestoreError
from sluice.state.keycodec import key_end
from sluice.state.keygroups import KeyGroupRange
from sluice.state.meta import RegisteredState, StateMeta
from sluice.state.transfer import FileRef, FileTransfer, download_verified

__all__ = [
    "SCHEMA",
    "GroupWriter",
    "canonical_groups",
    "entry_rows",
    "handle_range",
    "merged_meta",
    "read_group",
    "split_entry_key",
]

FORMAT_VERSION = 1
SCHEMA = pa.schema(
    [
        pa.field("state", pa.string(), nullable=False),
        pa.field("key", pa.binary(), nullable=False),
        pa.field("namespace", pa.binary(), nullable=False),
        pa.field("user_key", pa.binary()),
        pa.field("value", pa.binary(), nullable=False),
        pa.field("expiry", pa.int64()),
    ]
)
_BATCH = 65536


def split_entry_key(entry: bytes) -> tuple[bytes, bytes]:
    """A hashmap table key's (key, namespace): the key, then the namespace length-prefixed when not empty."""
    end = key_end(entry)
    return entry[:end], entry[end + 2 :] if len(entry) > end else b""


def entry_rows(reg: RegisteredState, value: Any) -> Iterator[tuple[bytes | None, bytes, int | None]]:
    """One hashmap table entry's canonical rows ``(user key, value bytes, expiry)``: one per list element and
    map entry (a value with TTL is held as ``(value, expiry)``)."""
    if reg.kind == "value":
        items: Iterable[tuple[bytes | None, Any]] = [(None, value)]
    elif reg.kind == "list":
        items = [(None, x) for x in value]
    else:
        assert reg.key_serializer is not None
        items = [(reg.key_serializer.encode(k), x) for k, x in value.items()]
    encode = reg.serializer.encode
    for uk, x in items:
        v, expiry = x if reg.ttl is not None else (x, None)
        yield uk, encode(v), expiry


class GroupWriter:
    """Collects one key group's rows and writes them as an Arrow IPC stream."""

    def __init__(self) -> None:
        self._cols: tuple[list[Any], ...] = ([], [], [], [], [], [])
        self._chunks: list[pa.RecordBatch] = []  # rows added before those in _cols, not yet written
        self._chunk_rows = 0
        self._sink = pa.BufferOutputStream()
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None
        self.rows = 0

    def add(
        self, state: str, key: bytes, namespace: bytes, user_key: bytes | None, value: bytes, expiry: int | None
    ) -> None:
        """Add one row."""
        for col, v in zip(self._cols, (state, key, namespace, user_key, value, expiry), strict=True):
            col.append(v)
        self.rows += 1
        if self._chunk_rows + len(self._cols[0]) >= _BATCH:
            self._flush()

    def add_batch(self, rows: pa.RecordBatch) -> None:
        """Add rows in bulk (a batch of :data:`SCHEMA`): written in the same batches as if added one by one."""
        self._chunk_cols()
        at = 0
        while at < rows.num_rows:
            take = min(_BATCH - self._chunk_rows, rows.num_rows - at)
            self._chunks.append(rows.slice(at, take))
            self._chunk_rows += take
            at += take
            if self._chunk_rows >= _BATCH:
                self._flush()
        self.rows += rows.num_rows

    def _chunk_cols(self) -> None:
        """Move the rows added one by one into a chunk."""
        if self._cols[0]:
            batch = pa.record_batch([pa.array(c, f.type) for c, f in zip(self._cols, SCHEMA, strict=True)], schema=SCHEMA)
            self._chunks.append(batch)
            self._chunk_rows += batch.num_rows
            for c in self._cols:
                c.clear()

    def _flush(self) -> None:
        self._chunk_cols()
        if not self._chunks:
            return
        if self._writer is None:
            self._writer = pa.ipc.new_stream(self._sink, SCHEMA)
        if len(self._chunks) == 1:
            batch = self._chunks[0]
        else:
            batch = pa.Table.from_batches(self._chunks, SCHEMA).combine_chunks().to_batches()[0]
        self._writer.write_batch(batch)
        self._chunks, self._chunk_rows = [], 0

    def finish(self) -> bytes:
        """The IPC stream (empty bytes if no row was added)."""
        self._flush()
        if self._writer is None:
            return b""
        self._writer.close()
        return bytes(self._sink.getvalue().to_pybytes())


def read_group(data: bytes) -> pa.Table:
    """One key group's rows."""
    if not data:
        return SCHEMA.empty_table()
    try:
        table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    except pa.ArrowInvalid as exc:
        raise RestoreError(f"canonical keyed state is malformed: {exc}") from None
    if not table.schema.equals(SCHEMA):
        raise RestoreError(f"canonical keyed state has schema {table.schema}, expected {SCHEMA}")
    return table


def handle_range(handle: dict[str, Any]) -> KeyGroupRange:
    """The key groups a handle covers."""
    try:
        start, end = handle["key_groups"]
        return KeyGroupRange(int(start), int(end))
    except (KeyError, TypeError, ValueError):
        raise RestoreError("a keyed state handle has no valid key_groups") from None


def merged_meta(handles: Sequence[dict[str, Any]]) -> dict[str, StateMeta]:
    """The states the handles describe (the same state in several handles must agree)."""
    out: dict[str, StateMeta] = {}
    for h in handles:
        for name, plain in (h.get("states") or {}).items():
            meta = StateMeta.from_plain(plain)
            if out.setdefault(name, meta) != meta:
                raise RestoreError(f"state {name!r} is described differently by the checkpoint's subtasks")
    return out


def canonical_groups(
    handles: Sequence[dict[str, Any]], key_groups: KeyGroupRange, transfer: FileTransfer
) -> Iterator[tuple[int, pa.Table]]:
    """Every key group of ``key_groups`` in canonical ``handles``, as rows (downloaded files verified)."""
    for h in handles:
        if h.get("format") != "canonical":
            continue
        if h.get("version") != FORMAT_VERSION:
            raise RestoreError(f"canonical keyed state version {h.get('version')} is not readable by this sluice")
        for kg, data in (h.get("groups") or {}).items():
            if int(kg) in key_groups:
                yield int(kg), read_group(data)
        for kg, ref in (h.get("files") or {}).items():
            if int(kg) in key_groups:
                fd, tmp = tempfile.mkstemp(prefix="sluice-canonical-")
                os.close(fd)
                try:
                    download_verified(transfer, FileRef.from_plain(ref), tmp)
                    with open(tmp, "rb") as f:
                        yield int(kg), read_group(f.read())
                finally:
                    os.unlink(tmp)
