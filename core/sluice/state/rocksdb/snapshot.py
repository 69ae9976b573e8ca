"""RocksDB snapshots: incremental native checkpoints and canonical savepoints.

The synchronous part (in the backend) flushes the memtables and takes a native RocksDB checkpoint into a
local folder: hard links to the immutable SST files plus copies of the small files (MANIFEST, CURRENT,
OPTIONS). That folder is a consistent image; the asynchronous part works on it while the task goes on.

* :class:`IncrementalSnapshot` (Flink's ``RocksIncrementalSnapshotStrategy``) uploads only the SST files
  that the last *completed* checkpoint has not confirmed, and references the others by their earlier upload
  (placeholders); the small files are uploaded every time. Every file's SHA-256 is in the handle::

    {"backend": "rocksdb", "format": "native", "version": 1, "checkpoint_id": n, "key_groups": [s, e],
     "incremental": bool, "states": {...}, "shared": {sst name: FileRef + "placeholder"},
     "private": {file name: FileRef}}

  Shared files (under ``shared/``) are owned by the shared-state registry; private ones by the checkpoint.
* :class:`CanonicalExport` writes a savepoint in the canonical format (:mod:`sluice.state.canonical`),
  one file per key group, by iterating the checkpoint (rocksdict's snapshot iteration does not isolate).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sluice.state.canonical import FORMAT_VERSION, GroupWriter
from sluice.state.keycodec import split_entry
from sluice.state.meta import TIMER_STATES, RegisteredState, StateMeta, unpack_expiry
from sluice.state.rocksdb.states import split_list
from sluice.state.rocksdb.timers import decode_timer
from sluice.state.spi import Handle, StateSnapshot
from sluice.state.transfer import FileRef, upload_file

if TYPE_CHECKING:
    from sluice.state.rocksdb.backend import RocksDBKeyedStateBackend

__all__ = ["NATIVE_VERSION", "CanonicalExport", "IncrementalSnapshot"]

NATIVE_VERSION = 1


class _Snapshot(StateSnapshot):
    def __init__(self, backend: RocksDBKeyedStateBackend, folder: str, checkpoint_id: int, meta: dict[str, StateMeta]) -> None:
        self._be = backend
        self._folder = folder
        self._cid = checkpoint_id
        self._meta = meta

    def _head(self, fmt: str) -> dict[str, Any]:
        kgs = self._be.key_groups
        return {
            "backend": "rocksdb",
            "format": fmt,
            "version": FORMAT_VERSION if fmt == "canonical" else NATIVE_VERSION,
            "checkpoint_id": self._cid,
            "key_groups": [kgs.start, kgs.end],
            "states": {n: m.to_plain() for n, m in self._meta.items()},
        }

    def discard(self) -> None:
        shutil.rmtree(self._folder, ignore_errors=True)


class IncrementalSnapshot(_Snapshot):
    """Uploads a native checkpoint: new SST files shared, reused ones as placeholders, the rest private."""

    def __init__(
        self,
        backend: RocksDBKeyedStateBackend,
        folder: str,
        checkpoint_id: int,
        meta: dict[str, StateMeta],
        confirmed: dict[str, FileRef] | None,
    ) -> None:
        super().__init__(backend, folder, checkpoint_id, meta)
        self._confirmed = confirmed  # None: a full checkpoint (incremental off)

    def run(self) -> Handle:
        be, cid = self._be, self._cid
        shared: dict[str, dict[str, Any]] = {}
        private: dict[str, dict[str, Any]] = {}
        try:
            for name in sorted(os.listdir(self._folder)):
                local = os.path.join(self._folder, name)
                if name.endswith(".sst") and self._confirmed is not None:
                    ref = self._confirmed.get(name)
                    if ref is not None and ref.size == os.path.getsize(local):
                        shared[name] = {**ref.to_plain(), "placeholder": True}
                    else:
                        ref = upload_file(be.transfer, local, be.paths.shared(f"{be.instance}-{cid}-{name}"))
                        shared[name] = {**ref.to_plain(), "placeholder": False}
                else:
                    private[name] = upload_file(be.transfer, local, be.paths.private(cid, name)).to_plain()
        finally:
            self.discard()
        be.record_upload(cid, {n: FileRef.from_plain(r) for n, r in shared.items()})
        return {**self._head("native"), "incremental": self._confirmed is not None, "shared": shared, "private": private}


class CanonicalExport(_Snapshot):
    """Writes the checkpoint's entries as a canonical savepoint, one verified file per key group."""

    def __init__(
        self,
        backend: RocksDBKeyedStateBackend,
        folder: str,
        checkpoint_id: int,
        meta: dict[str, StateMeta],
        registered: dict[str, RegisteredState],
        now: int,
    ) -> None:
        super().__init__(backend, folder, checkpoint_id, meta)
        self._registered = registered
        self._now = now

    def run(self) -> Handle:
        be = self._be
        files: dict[int, dict[str, Any]] = {}
        db = be.open_readonly(self._folder)
        try:
            writer: GroupWriter | None = None
            current = -1

            def finish() -> None:
                if writer is not None and writer.rows:
                    files[current] = self._upload(current, writer.finish())

            for entry, value in be.scan_db(db, b"", b"\xff\xff\xff", 0):
                kg = int.from_bytes(entry[:2], "big")
                if kg not in be.key_groups:
                    continue
                if kg != current:
                    finish()
                    writer, current = GroupWriter(), kg
                assert writer is not None
                self._add(writer, entry, value)
            finish()
        finally:
            db.close()
            self.discard()
        return {**self._head("canonical"), "files": files}

    def _add(self, writer: GroupWriter, entry: bytes, value: bytes) -> None:
        n = entry[2]
        name = entry[3 : 3 + n].decode("utf-8")
        if name in TIMER_STATES:
            ts, key, ns = decode_timer(entry, 3 + n)
            writer.add(name, key, ns, None, ts.to_bytes(8, "big", signed=True), None)
            return
        meta = self._meta.get(name)
        if meta is None:
            return
        _, _, key, ns, uk = split_entry(entry)
        reg = self._registered.get(name)
        drop: Callable[[int | None], bool] = (
            (lambda e: e is not None and e <= self._now)
            if reg is not None and reg.ttl is not None and reg.ttl.cleanup_full_snapshot
            else (lambda e: False)
        )
        if meta.kind == "list":
            elements = split_list(meta.ttl, value)
        else:
            elements = [(value[8:], unpack_expiry(value)) if meta.ttl else (value, None)]
        for v, e in elements:
            if not drop(e):
                writer.add(name, key, ns, uk if meta.kind == "map" else None, v, e)

    def _upload(self, kg: int, data: bytes) -> dict[str, Any]:
        be = self._be
        fd, tmp = tempfile.mkstemp(prefix="sluice-savepoint-", dir=be.root)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return upload_file(be.transfer, tmp, be.paths.private(self._cid, f"kg-{kg}.arrows", savepoint=True)).to_plain()
        finally:
            os.unlink(tmp)

