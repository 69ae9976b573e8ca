"""Restoring a RocksDB keyed backend from the handles of old subtasks, by key group.

* The native handle that overlaps this subtask's key groups most is the base: its files are downloaded
  (each checked against its SHA-256) and opened; key groups outside this subtask's range are dropped
  (``delete_range`` + ``compact_range``). Its SST files stay confirmed, so the next checkpoint reuses them.
* Every other overlapping native handle (scaling in) is downloaded to a temporary folder, its entries in
  this subtask's key groups written to an SST file (``SstFileWriter``) and ingested.
* Canonical handles (savepoints, the hashmap backend's checkpoints) are read key group by key group and
  written in write batches, skipping expired values.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sluice.errors import RestoreError
from sluice.state.canonical import canonical_groups, handle_range
from sluice.state.keycodec import namespace_part, state_id
from sluice.state.keygroups import KeyGroupRange
from sluice.state.meta import TIMER_STATES, StateMeta, pack_expiry
from sluice.state.rocksdb.resources import rocksdict_module
from sluice.state.rocksdb.snapshot import NATIVE_VERSION
from sluice.state.rocksdb.states import join_list
from sluice.state.rocksdb.timers import encode_timestamp
from sluice.state.transfer import FileRef, download_verified

if TYPE_CHECKING:
    from sluice.state.rocksdb.backend import RocksDBKeyedStateBackend

__all__ = ["restore_handles"]

_END = b"\xff\xff\xff"


def _overlap(a: KeyGroupRange, b: KeyGroupRange) -> KeyGroupRange:
    start = max(a.start, b.start)
    return KeyGroupRange(start, max(start, min(a.end, b.end)))


def _files(handle: dict[str, Any]) -> dict[str, FileRef]:
    out = {}
    for section in ("shared", "private"):
        for name, ref in (handle.get(section) or {}).items():
            if not name or "/" in name or "\\" in name or name.startswith("."):
                raise RestoreError(f"a RocksDB state handle names an invalid file {name!r}")
            out[name] = FileRef.from_plain(ref)
    return out


def download(be: RocksDBKeyedStateBackend, handle: dict[str, Any], folder: str) -> None:
    """Every file of a native handle into ``folder``, verified."""
    os.makedirs(folder, exist_ok=True)
    for name, ref in _files(handle).items():
        download_verified(be.transfer, ref, os.path.join(folder, name))


def _check(handle: dict[str, Any]) -> None:
    if handle.get("format") == "native":
        if handle.get("backend") != "rocksdb" or handle.get("version") != NATIVE_VERSION:
            raise RestoreError(
                f"keyed state in the native format of the {handle.get('backend')!r} backend (version "
                f"{handle.get('version')}) cannot be restored by the rocksdb backend: switch backends through "
                "a savepoint"
            )
    elif handle.get("format") != "canonical":
        raise RestoreError(f"keyed state handle of unknown format {handle.get('format')!r}")


def restore_handles(be: RocksDBKeyedStateBackend, handles: Sequence[dict[str, Any]]) -> None:
    """Load this subtask's key groups out of ``handles`` into ``be`` (a fresh backend)."""
    for h in handles:
        _check(h)
    ours = be.key_groups
    native = [(len(_overlap(handle_range(h), ours)), i, h) for i, h in enumerate(handles) if h["format"] == "native"]
    native = [n for n in native if n[0] > 0]
    if native:
        _, _, base = max(native, key=lambda n: (n[0], -n[1]))
        be.replace_db(lambda folder: download(be, base, folder))
        theirs = handle_range(base)
        if theirs.start < ours.start or theirs.end > ours.end:
            clip(be, ours)
        if base.get("incremental"):
            live = {os.path.basename(f["name"]) for f in be.db.live_files()}
            shared = {n: FileRef.from_plain(r) for n, r in (base.get("shared") or {}).items() if n in live}
            be.restored_files(shared)
        for _, _, h in native:
            if h is not base:
                ingest(be, h, _overlap(handle_range(h), ours))
    canonical = [h for h in handles if h["format"] == "canonical"]
    if canonical:
        import_canonical(be, canonical)


def clip(be: RocksDBKeyedStateBackend, ours: KeyGroupRange) -> None:
    """Drop the key groups outside ``ours`` and compact the ranges they held."""
    lo, hi = ours.start.to_bytes(2, "big"), ours.end.to_bytes(2, "big")
    wo = be.resources.write_options()
    if ours.start > 0:
        be.db.delete_range(b"\x00", lo, wo)
        be.db.compact_range(None, lo)
    be.db.delete_range(hi, _END, wo)
    be.db.compact_range(hi, None)


def ingest(be: RocksDBKeyedStateBackend, handle: dict[str, Any], kgs: KeyGroupRange) -> None:
    """Ingest the key groups ``kgs`` of another subtask's native handle (as one SST file)."""
    rd = rocksdict_module()
    folder = tempfile.mkdtemp(prefix="ingest-", dir=be.root)
    try:
        download(be, handle, folder)
        src = be.open_readonly(folder)
        sst = os.path.join(folder, "ingest.sst")
        writer = rd.SstFileWriter(be.resources.options())
        writer.open(sst)
        count = 0
        try:
            for key, value in be.scan_db(src, kgs.start.to_bytes(2, "big"), kgs.end.to_bytes(2, "big"), 0):
                writer[key] = value
                count += 1
        finally:
            src.close()
        if count:
            writer.finish()
            be.db.ingest_external_file([sst])
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def import_canonical(be: RocksDBKeyedStateBackend, handles: Sequence[dict[str, Any]]) -> None:
    """Write canonical rows of this subtask's key groups, skipping expired values."""
    meta: dict[str, StateMeta] = be.restored_meta
    now = be.clock()
    for kg, rows in canonical_groups(handles, be.key_groups, be.transfer):
        kgp = be.kg_prefixes[kg]
        lists: dict[bytes, list[tuple[bytes, int | None]]] = {}
        batch: list[tuple[bytes, bytes | None]] = []
        cols = [rows.column(c).to_pylist() for c in ("state", "key", "namespace", "user_key", "value", "expiry")]
        for name, key, ns, uk, value, expiry in zip(*cols, strict=True):
            if expiry is not None and expiry <= now:
                continue
            sid = state_id(name)
            if name in TIMER_STATES:
                ts = int.from_bytes(value, "big", signed=True)
                batch.append((kgp + sid + encode_timestamp(ts) + key + namespace_part(ns), b""))
                continue
            m = meta.get(name)
            if m is None:
                raise RestoreError(f"canonical keyed state has rows of state {name!r} but no description of it")
            entry = kgp + sid + key + namespace_part(ns)
            if m.kind == "list":
                lists.setdefault(entry, []).append((value, expiry if m.ttl else None))
                continue
            head = pack_expiry(expiry) if m.ttl and expiry is not None else b""
            if m.ttl and expiry is None:
                raise RestoreError(f"canonical keyed state of state {name!r} (with TTL) has a row without expiry")
            batch.append((entry + (uk or b"") if m.kind == "map" else entry, head + value))
        batch.extend((entry, join_list(elements)) for entry, elements in lists.items())
        be.write_many(batch)
