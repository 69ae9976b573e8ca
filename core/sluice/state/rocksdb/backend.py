"""The RocksDB keyed backend: one embedded RocksDB (rocksdict, raw bytes, no WAL) per operator subtask.

Entries are laid out ``key group | state | key | namespace | user key`` (:mod:`sluice.state.keycodec`), so
a key group is a contiguous key range: rescaling clips or ingests ranges. Point reads and writes go through
a write-back cache (:mod:`~sluice.state.rocksdb.cache`) that is written back before every scan and snapshot.
Snapshots are in :mod:`~sluice.state.rocksdb.snapshot`, restores in :mod:`~sluice.state.rocksdb.restore`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice.state.canonical import merged_meta
from sluice.state.config import StateBackendConfig
from sluice.state.keycodec import (
    binary_parts,
    decode_key,
    gather_binary,
    key_widths,
    namespace_part,
    state_id,
)
from sluice.state.keygroups import KeyGroupRange
from sluice.state.meta import RegisteredState, unpack_expiry
from sluice.state.registration import RegisteringKeyedStateBackend
from sluice.state.rocksdb import workdir
from sluice.state.rocksdb.cache import EntryCache
from sluice.state.rocksdb.resources import RocksResources, rocksdict_module
from sluice.state.rocksdb.snapshot import CanonicalExport, IncrementalSnapshot
from sluice.state.rocksdb.states import (
    RocksBatchValueState,
    RocksListState,
    RocksMapState,
    RocksValueState,
    join_list,
    split_list,
    successor,
)
from sluice.state.rocksdb.timers import RocksDBTimerService
from sluice.state.spi import Handle, StateBackend, StatePaths, StateSnapshot
from sluice.state.transfer import FileRef, FileTransfer

__all__ = ["RocksDBKeyedStateBackend", "RocksDBStateBackend"]

#: accesses of states with a background TTL cleanup between two cleanup scans (a scan opens an iterator)
_CLEANUP_EVERY = 1000


class RocksDBKeyedStateBackend(RegisteringKeyedStateBackend):
    """Keyed state of one operator subtask in an embedded RocksDB under ``root``."""

    backend_name = "rocksdb"
    handle_classes = {"value": RocksValueState, "list": RocksListState, "map": RocksMapState}
    batch_class = RocksBatchValueState
    ttl_layout_fixed = True  # a value with TTL starts with its expiry time

    def __init__(
        self,
        key_groups: KeyGroupRange,
        max_parallelism: int,
        transfer: FileTransfer,
        paths: StatePaths,
        clock: Callable[[], int] | None,
        resources: RocksResources,
        root: str,
        incremental: bool,
    ) -> None:
        super().__init__(key_groups, max_parallelism, transfer, paths, clock)
        self.resources = resources
        self.root = root
        self.incremental = incremental
        #: names this instance's uploads (a restart or a rescale starts a new one)
        self.instance = uuid.uuid4().hex[:12]
        self.kg_prefixes = [kg.to_bytes(2, "big") for kg in range(max_parallelism)]
        self._wo = resources.write_options()
        self._db_path = os.path.join(root, "db")
        self.db: Any = self._open(self._db_path)
        resources.attach()
        self._attached = True
        #: point reads and writes (a write-back cache when the memory budget gives it a share)
        self.cache = EntryCache(lambda: self.db, self._wo, resources.write_cache_share)
        #: the states whose entries the cache may hold (the others are only written past it); any state's
        #: once raw entries were written through :meth:`write_many` (a changelog restore)
        self.cached_states: set[bytes] = set()
        self.raw_writes = False
        self._timers = RocksDBTimerService(self)
        self._lock = threading.Lock()
        self._confirmed: dict[str, FileRef] = {}  # SST name -> upload confirmed by the last completed checkpoint
        self._uploads: dict[int, dict[str, FileRef]] = {}  # checkpoint id -> its SST files
        self._cleanup_cursor = b""
        self._accesses = 0

    @property
    def change_log(self) -> dict[bytes, bytes | None] | None:
        """With change capture on (changelog checkpoints): every entry written since the last checkpoint,
        its last value (None: deleted); kept by the write-back cache, which every write goes through."""
        return self.cache.log

    @change_log.setter
    def change_log(self, log: dict[bytes, bytes | None] | None) -> None:
        self.cache.log = log

    # -- the database ---------------------------------------------------------------------------------
    def _open(self, path: str) -> Any:
        # the column family's options named explicitly: given only the database's, rocksdict opens a folder
        # that holds an OPTIONS file (a restored checkpoint, a reopened database) with the column family
        # options of that file, so a restored database ran with RocksDB's default 8 MB block cache of its
        # own, outside the memory budget, and with the table and compaction options of the checkpoint's job
        return rocksdict_module().Rdict(
            path, self.resources.options(), column_families={"default": self.resources.options()}
        )

    def open_readonly(self, path: str) -> Any:
        """Open another database folder (a checkpoint, a downloaded handle) with this backend's options."""
        return self._open(path)

    def replace_db(self, fill: Callable[[str], None]) -> None:
        """Close the database, let ``fill`` write a new folder, open it."""
        self.db.close()
        self.db = None  # a restore that fails leaves the backend closed
        self.cache.clear()
        shutil.rmtree(self._db_path, ignore_errors=True)
        fill(self._db_path)
        self.db = self._open(self._db_path)
        self._handles.clear()
        self._timers.forget()

    def entry_key(self, sid: bytes) -> bytes:
        """The storage key of the current key and namespace in state ``sid``."""
        return self.kg_prefixes[self._kg] + sid + self._key_bytes + namespace_part(self._namespace)

    def get(self, key: bytes) -> bytes | None:
        """Read one entry (None: absent)."""
        return self.cache.get(key)

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """Read entries (the cache's misses with one multi-get)."""
        return self.cache.get_many(keys)

    def put(self, key: bytes, value: bytes) -> None:
        """Write one entry."""
        self.cache.put(key, value)

    def delete(self, key: bytes) -> None:
        """Delete one entry."""
        self.cache.put(key, None)

    def write_many(self, entries: Iterable[tuple[bytes, bytes | None]]) -> None:
        """Write entries (a None value deletes; a key repeated keeps its last value)."""
        self.raw_writes = True
        self.cache.write(entries)

    def flush(self) -> None:
        """Write the cache's dirty entries and the memtables to disk."""
        self.cache.flush()
        self.db.flush()

    def put_many(self, entries: Iterable[tuple[bytes, bytes]]) -> None:
        """Write entries in one write batch."""
        self.write_many(entries)

    def delete_many(self, keys: Iterable[bytes]) -> None:
        """Delete entries in one write batch."""
        self.write_many((k, None) for k in keys)

    def scan_db(self, db: Any, lo: bytes, hi: bytes, strip: int) -> Iterator[tuple[bytes, bytes]]:
        """Entries of ``db`` in ``[lo, hi)`` in key order, keys without their first ``strip`` bytes."""
        rd = rocksdict_module()
        ro = rd.ReadOptions()
        ro.set_iterate_upper_bound(hi)
        it = db.iter(ro)
        it.seek(lo)
        while it.valid():
            yield it.key()[strip:], it.value()
            it.next()

    def scan(self, lo: bytes, hi: bytes, strip: int) -> Iterator[tuple[bytes, bytes]]:
        """:meth:`scan_db` over this backend's database (the cache written back first)."""
        self.cache.flush()
        return self.scan_db(self.db, lo, hi, strip)

    # -- state ----------------------------------------------------------------------------------------
    def keys(self, name: str) -> Iterator[tuple[int, Any]]:
        for kg, keys in self.encoded_keys(name):
            for key in keys.to_pylist():
                yield kg, decode_key(key)

    def encoded_keys(self, name: str) -> Iterator[tuple[int, pa.Array]]:
        sid = state_id(name)
        rd = rocksdict_module()
        for kg in self.key_groups:
            self.cache.flush()  # the caller may have written since the last key group
            prefix = self.kg_prefixes[kg] + sid
            ro = rd.ReadOptions()
            ro.set_iterate_upper_bound(successor(prefix))
            entries = list(self.db.keys(from_key=prefix, read_opt=ro))  # keys only: no value is read
            if entries:
                yield kg, _default_namespace_keys(pa.array(entries, pa.binary()), len(prefix))

    @property
    def timers(self) -> RocksDBTimerService:
        return self._timers

    # -- TTL ------------------------------------------------------------------------------------------
    def background_cleanup(self, reg: RegisteredState, accesses: int) -> None:
        """Count state accesses; every so often scan a chunk of entries for expired values."""
        assert reg.ttl is not None
        self._accesses += accesses
        if self._accesses >= _CLEANUP_EVERY:
            self._accesses = 0
            self.cleanup_expired(_CLEANUP_EVERY * reg.ttl.cleanup_size)

    def cleanup_expired(self, max_entries: int) -> int:
        ttl_states = {r.sid: r for r in self._registered.values() if r.ttl is not None}
        if not ttl_states:
            return 0
        now, removed, seen = self.clock(), 0, 0
        rewrites: list[tuple[bytes, bytes | None]] = []
        start = self._cleanup_cursor
        for key, value in self.scan(start, b"\xff\xff\xff", 0):  # the cache written back first
            seen += 1
            if seen > max_entries:
                self._cleanup_cursor = key
                break
            n = key[2]
            reg = ttl_states.get(key[2 : 3 + n])
            if reg is None:
                continue
            if reg.kind == "list":
                elements = split_list(True, value)
                live = [(v, e) for v, e in elements if e is not None and e > now]
                if len(live) < len(elements):
                    rewrites.append((key, join_list(live) if live else None))
                    removed += len(elements) - len(live)
            elif unpack_expiry(value) <= now:
                rewrites.append((key, None))
                removed += 1
        else:
            self._cleanup_cursor = b""
        self.write_many(rewrites)
        return removed

    def drop_state(self, name: str) -> None:
        sid = state_id(name)
        self.cache.flush()
        log = self.cache.log
        for kg in self.key_groups:
            lo = self.kg_prefixes[kg] + sid
            hi = successor(lo)
            if log is not None:  # changelog checkpoints: each removed entry is a change to log
                log.update((lo + rest, None) for rest, _ in self.scan_db(self.db, lo, hi, len(lo)))
            self.db.delete_range(lo, hi, self._wo)
        self.cache.forget(sid)
        self.cached_states.discard(sid)
        self.forget_state(name)

    # -- checkpoints ----------------------------------------------------------------------------------
    def snapshot(self, checkpoint_id: int, savepoint: bool = False) -> StateSnapshot:
        folder = os.path.join(self.root, f"{'sp' if savepoint else 'chk'}-{checkpoint_id}")
        shutil.rmtree(folder, ignore_errors=True)
        self.flush()
        rocksdict_module().Checkpoint(self.db).create_checkpoint(folder)
        if savepoint:
            return CanonicalExport(self, folder, checkpoint_id, self.state_meta(), dict(self._registered), self.clock())
        with self._lock:
            confirmed = dict(self._confirmed) if self.incremental else None
        return IncrementalSnapshot(self, folder, checkpoint_id, self.state_meta(), confirmed)

    def record_upload(self, checkpoint_id: int, shared: dict[str, FileRef]) -> None:
        """The asynchronous part of checkpoint ``checkpoint_id`` uploaded (or reused) ``shared``."""
        if self.incremental:
            with self._lock:
                self._uploads[checkpoint_id] = shared

    def restored_files(self, shared: dict[str, FileRef]) -> None:
        """The restored checkpoint completed: its SST files (still live) may be reused."""
        with self._lock:
            self._confirmed = dict(shared)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        with self._lock:
            if checkpoint_id in self._uploads:
                self._confirmed = self._uploads[checkpoint_id]
            for cid in [c for c in self._uploads if c <= checkpoint_id]:
                del self._uploads[cid]

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        with self._lock:
            self._uploads.pop(checkpoint_id, None)

    def restore(self, handles: Sequence[Handle]) -> None:
        if any(h.get("format") == "changelog" for h in handles):
            from sluice.state.changelog.restore import restore_changelog

            restore_changelog(self, handles)
            return
        from sluice.state.rocksdb.restore import restore_handles

        self.restored_meta.update(merged_meta(handles))
        self.cache.clear()
        restore_handles(self, handles)
        self._timers.forget()

    def dispose(self) -> None:
        self.cache.clear()
        if self._attached:
            self._attached = False
            self.resources.detach()
        try:
            if self.db is not None:
                self.db.close()
                self.db = None
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
            workdir.release(self.root)


def _default_namespace_keys(entries: pa.Array, strip: int) -> pa.Array:
    """The keys of sorted storage keys ``prefix | key | u16 namespace length, namespace | user key`` (the
    prefix ``strip`` bytes) whose namespace is empty, each once (a map state has an entry per user key)."""
    buf, starts, lengths = binary_parts(entries)
    starts, lengths = starts + strip, lengths - strip
    widths = key_widths(buf, starts, lengths)
    rows = np.flatnonzero(lengths >= widths + 2)
    ns = starts[rows] + widths[rows]
    rows = rows[(buf[ns] == 0) & (buf[ns + 1] == 0)]
    keys = gather_binary(buf, starts[rows], widths[rows])
    if len(keys) > 1:
        new = pc.not_equal(keys.slice(1), keys.slice(0, len(keys) - 1)).to_numpy(zero_copy_only=False)
        if not new.all():
            keys = keys.filter(pa.array(np.r_[True, new]))
    return keys


class RocksDBStateBackend(StateBackend):
    """The RocksDB state backend: keyed state on local disk, incremental checkpoints, a memory budget.

    Its block cache and write buffer manager are made once per process (not pickled with the backend).
    """

    def __init__(self, config: StateBackendConfig | None = None) -> None:
        super().__init__(config or StateBackendConfig(type="rocksdb"))
        rocksdict_module()
        self._resources: RocksResources | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.config, "_resources": None}

    @property
    def resources(self) -> RocksResources:
        """The memory this backend's instances share in this process."""
        if self._resources is None:
            c = self.config
            self._resources = RocksResources(
                c.memory, c.write_buffer_ratio, c.write_cache_ratio, c.compaction_style, c.bloom_bits_per_key,
                c.partitioned_index_filters,
            )  # fmt: skip
        return self._resources

    def create_keyed_backend(
        self,
        owner: str,
        key_groups: KeyGroupRange,
        max_parallelism: int,
        transfer: FileTransfer,
        clock: Callable[[], int] | None = None,
    ) -> RocksDBKeyedStateBackend:
        base = self.config.local_dir or os.path.join(tempfile.gettempdir(), "sluice-rocksdb")
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in owner)
        root = workdir.claim(base, f"{safe}-")  # folders killed processes left there are deleted
        return RocksDBKeyedStateBackend(
            key_groups, max_parallelism, transfer, StatePaths(owner), clock, self.resources, root, self.config.incremental
        )
