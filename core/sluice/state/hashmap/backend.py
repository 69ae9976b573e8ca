"""The hashmap keyed backend: Python objects per (state, key group), copy-on-write full snapshots.

The synchronous part of a snapshot freezes the tables (O(key groups), no copying); the asynchronous part
encodes them with the states' serializers into the canonical format (:mod:`sluice.state.canonical`), one
Arrow IPC stream per key group, inline in the handle (raw sections of the signed task state file). A
checkpoint of this backend is therefore also a savepoint the RocksDB backend restores.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sluice.errors import RestoreError
from sluice.state.canonical import (
    FORMAT_VERSION,
    SCHEMA,
    GroupWriter,
    canonical_groups,
    entry_rows,
    merged_meta,
    split_entry_key,
)
from sluice.state.config import StateBackendConfig
from sluice.state.hashmap.bulk import bulk_rows, state_column
from sluice.state.hashmap.states import HeapBatchValueState, HeapListState, HeapMapState, HeapValueState
from sluice.state.hashmap.tables import HeapTimerService, Table, TrackedTables
from sluice.state.keycodec import binary_parts, decode_key, key_widths, namespace_part
from sluice.state.keygroups import KeyGroupRange
from sluice.state.meta import EVENT_TIMERS, TIMER_STATES, RegisteredState, StateMeta
from sluice.state.registration import RegisteringKeyedStateBackend
from sluice.state.spi import (
    Handle,
    StateBackend,
    StatePaths,
    StateSnapshot,
    TimeDomain,
    TimerService,
)
from sluice.state.transfer import FileTransfer

__all__ = ["HashMapKeyedStateBackend", "HashMapStateBackend", "HeapChanges"]

_TS = 8

#: what :meth:`HashMapKeyedStateBackend.take_changes` returns: the changed entries ``(state, key group, entry
#: key, value or None)``, the changed timers ``(domain, timestamp, key group, key, namespace, registered)``,
#: the states' serializers and the time of the seal
HeapChanges = tuple[
    list[tuple[str, int, bytes, Any]],
    list[tuple[int, int, int, bytes, bytes, bool]],
    dict[str, RegisteredState],
    int,
]


class HashMapKeyedStateBackend(RegisteringKeyedStateBackend):
    """Keyed state of one operator subtask, in memory."""

    backend_name = "hashmap"
    handle_classes = {"value": HeapValueState, "list": HeapListState, "map": HeapMapState}
    batch_class = HeapBatchValueState
    ttl_layout_fixed = False  # a restore decodes values: a TTL may be added or removed

    def __init__(
        self,
        key_groups: KeyGroupRange,
        max_parallelism: int,
        transfer: FileTransfer,
        paths: StatePaths,
        clock: Callable[[], int] | None = None,
    ) -> None:
        super().__init__(key_groups, max_parallelism, transfer, paths, clock)
        self._tables: dict[str, TrackedTables] = {}
        self._pending: dict[str, list[tuple[int, pa.Table]]] = {}  # restored, not yet read by a descriptor
        self._timers = HeapTimerService()
        self._cleanup: Iterator[int] | None = None
        self._capture = False

    # -- access used by the handles -------------------------------------------------------------------
    def tables_of(self, name: str) -> dict[int, Table]:
        """The tables (by key group) of state ``name``."""
        tables = self._tables.get(name)
        if tables is None:
            tables = self._tables[name] = TrackedTables(self._capture)
        return tables

    def entry_key(self) -> bytes:
        """The current key (and namespace) as a table key."""
        ns = self._namespace
        return self._key_bytes if not ns else self._key_bytes + namespace_part(ns)

    def on_register(self, reg: RegisteredState) -> None:
        for kg, rows in self._pending.pop(reg.name, []):
            self._load(reg, kg, rows)

    def keys(self, name: str) -> Iterator[tuple[int, Any]]:
        for kg, keys in self.encoded_keys(name):
            for key in keys.to_pylist():
                yield kg, decode_key(key)

    def encoded_keys(self, name: str) -> Iterator[tuple[int, pa.Array]]:
        for kg, t in list(self._tables.get(name, {}).items()):
            if t.data:
                entries = pa.array(list(t.data), pa.binary())
                buf, starts, lengths = binary_parts(entries)
                plain = key_widths(buf, starts, lengths) == lengths  # the default namespace: the key alone
                yield kg, entries if plain.all() else entries.filter(pa.array(plain))
        for kg, rows in list(self._pending.get(name, [])):
            plain = pc.equal(pc.binary_length(rows.column("namespace")), 0)
            yield kg, pc.unique(rows.column("key").filter(plain).combine_chunks())

    @property
    def timers(self) -> TimerService:
        return self._timers

    # -- TTL ------------------------------------------------------------------------------------------
    def background_cleanup(self, reg: RegisteredState, accesses: int = 1) -> None:
        """A step of the incremental cleanup, run on each access of a state with TTL (Flink's incremental
        cleanup: ``cleanup_size`` entries per access)."""
        assert reg.ttl is not None
        self.cleanup_expired(reg.ttl.cleanup_size * accesses)

    def _scan(self) -> Iterator[int]:
        for name, reg in list(self._registered.items()):
            if reg.ttl is None:
                continue
            for t in list(self._tables.get(name, {}).values()):
                for ek in list(t.data):
                    yield self._expire(reg, t, ek, self.clock())

    def _expire(self, reg: RegisteredState, t: Table, ek: bytes, now: int) -> int:
        """Remove what expired of one entry; the number of values removed."""
        v = t.data.get(ek)
        if v is None:
            return 0
        if reg.kind == "value":
            if v[1] > now:
                return 0
            t.delete(ek)
            return 1
        live: Any = [x for x in v if x[1] > now] if reg.kind == "list" else {k: x for k, x in v.items() if x[1] > now}
        if len(live) < len(v):
            t.put(ek, live) if live else t.delete(ek)
        return len(v) - len(live)

    def cleanup_expired(self, max_entries: int) -> int:
        removed, looped = 0, False
        for _ in range(max_entries):
            if self._cleanup is None:
                self._cleanup = self._scan()
            step = next(self._cleanup, None)
            if step is None:
                self._cleanup = None
                if looped:
                    break  # a whole pass within this call: nothing more to check
                looped = True
                continue
            removed += step
        return removed

    def drop_state(self, name: str) -> None:
        tables = self._tables.get(name)
        self._pending.pop(name, None)
        if self._capture and tables:  # changelog checkpoints: each removed entry is a change to log
            for t in tables.values():
                for ek in list(t.data):
                    t.delete(ek)
            return
        self._tables.pop(name, None)
        self.forget_state(name)

    # -- changelog ------------------------------------------------------------------------------------
    def capture_changes(self) -> None:
        """Track changed entries and timers from now on, for changelog checkpoints
        (:meth:`take_changes`)."""
        self._capture = True
        for tables in self._tables.values():
            tables.capture = True
            for t in tables.values():
                t.dirty = set() if t.dirty is None else t.dirty
        self._timers.dirty = set() if self._timers.dirty is None else self._timers.dirty

    def take_changes(self) -> HeapChanges:
        """The entries and timers changed since the last call, with their values now (list and map values
        copied): the synchronous part of a changelog checkpoint, O(changes)."""
        entries: list[tuple[str, int, bytes, Any]] = []
        for name, tables in self._tables.items():
            for kg, t in tables.items():
                if t.dirty:
                    dirty, t.dirty, data = t.dirty, set(), t.data
                    for ek in dirty:
                        v = data.get(ek)
                        entries.append((name, kg, ek, copy.copy(v) if isinstance(v, list | dict) else v))
        timers: list[tuple[int, int, int, bytes, bytes, bool]] = []
        if self._timers.dirty:
            dirty_timers, self._timers.dirty = self._timers.dirty, set()
            for domain, ts, kg, key, ns in dirty_timers:
                timers.append((domain, ts, kg, key, ns, self._timers.is_registered(TimeDomain(domain), ts, key, ns)))
        return entries, timers, dict(self._registered), self.clock()

    def has_changes(self) -> bool:
        """Whether anything changed since the last :meth:`take_changes`."""
        return bool(self._timers.dirty) or any(t.dirty for tables in self._tables.values() for t in tables.values())

    # -- checkpoints ----------------------------------------------------------------------------------
    def snapshot(self, checkpoint_id: int, savepoint: bool = False) -> StateSnapshot:
        frozen: dict[str, dict[int, dict[bytes, Any]]] = {}
        for name, tables in self._tables.items():
            frozen[name] = {kg: t.freeze() for kg, t in tables.items() if t.data}
        timers = [(d, list(self._timers.timers(d))) for d in TimeDomain]
        pending = {name: list(rows) for name, rows in self._pending.items()}
        return _HeapSnapshot(self, frozen, timers, pending, dict(self._registered), self.state_meta(), self.clock())

    def restore(self, handles: Sequence[Handle]) -> None:
        if any(h.get("format") == "changelog" for h in handles):
            from sluice.state.changelog.restore import restore_changelog

            restore_changelog(self, handles)
            return
        for h in handles:
            if h.get("format") != "canonical":
                raise RestoreError(
                    f"keyed state written by the {h.get('backend', 'unknown')} state backend in its native "
                    "format cannot be restored by the hashmap backend: restore it with that backend, or "
                    "switch backends through a savepoint"
                )
        self.restore_groups(merged_meta(handles), canonical_groups(handles, self.key_groups, self.transfer))

    def restore_groups(self, meta: dict[str, StateMeta], groups: Iterable[tuple[int, pa.Table]]) -> None:
        """Load canonical rows by key group (those of key groups this subtask owns), skipping expired ones."""
        self.restored_meta.update(meta)
        now = self.clock()
        for kg, rows in groups:
            if kg not in self.key_groups:
                continue
            expiry = rows.column("expiry").to_pylist()
            live = pa.array([e is None or e > now for e in expiry], pa.bool_())
            rows = rows.filter(live)  # cleanup on restore
            for name in set(rows.column("state").to_pylist()):
                part = rows.filter(pc.equal(rows.column("state"), name))
                if name in TIMER_STATES:
                    domain = TimeDomain.EVENT if name == EVENT_TIMERS else TimeDomain.PROCESSING
                    for key, ns, value in zip(*(part.column(c).to_pylist() for c in ("key", "namespace", "value")), strict=True):
                        self._timers.register(domain, int.from_bytes(value, "big", signed=True), kg, key, ns)
                elif name in self._registered:
                    self._load(self._registered[name], kg, part)
                else:
                    self._pending.setdefault(name, []).append((kg, part))

    def _load(self, reg: RegisteredState, kg: int, rows: pa.Table) -> None:
        """Decode restored canonical rows of ``reg`` into its table of ``kg``."""
        tables = self.tables_of(reg.name)
        t = tables.get(kg)
        if t is None:
            t = tables[kg] = Table()
        data = t.writable()
        now = self.clock()
        values = [reg.serializer.decode(v) for v in rows.column("value").to_pylist()]
        cols = (rows.column(c).to_pylist() for c in ("key", "namespace", "user_key", "expiry"))
        for (key, ns, uk, expiry), value in zip(zip(*cols, strict=True), values, strict=True):
            ek = key if not ns else key + namespace_part(ns)
            if reg.ttl is not None:
                value = (value, expiry if expiry is not None else reg.expiry(now))
            if reg.kind == "value":
                data[ek] = value
            elif reg.kind == "list":
                data.setdefault(ek, []).append(value)
            else:
                assert reg.key_serializer is not None
                data.setdefault(ek, {})[reg.key_serializer.decode(uk)] = value

    def dispose(self) -> None:
        self._tables.clear()
        self._pending.clear()


class _HeapSnapshot(StateSnapshot):
    def __init__(
        self,
        backend: HashMapKeyedStateBackend,
        frozen: dict[str, dict[int, dict[bytes, Any]]],
        timers: list[tuple[TimeDomain, list[Any]]],
        pending: dict[str, list[tuple[int, pa.Table]]],
        registered: dict[str, RegisteredState],
        meta: dict[str, StateMeta],
        now: int,
    ) -> None:
        self._be, self._frozen, self._timers, self._pending = backend, frozen, timers, pending
        self._registered, self._meta, self._now = registered, meta, now

    def run(self) -> Handle:
        writers: dict[int, GroupWriter] = {}

        def writer(kg: int) -> GroupWriter:
            return writers.setdefault(kg, GroupWriter())

        for name, groups in self._frozen.items():
            reg = self._registered[name]
            drop = reg.ttl is not None and reg.ttl.cleanup_full_snapshot
            now = self._now
            for kg, data in groups.items():
                w = writer(kg)
                cols = bulk_rows(reg, data)
                if cols is not None:
                    w.add_batch(pa.record_batch([state_column(name, len(cols[0])), *cols], schema=SCHEMA))
                    continue
                for ek, v in data.items():
                    key, ns = split_entry_key(ek)
                    for uk, value, expiry in entry_rows(reg, v):
                        if drop and expiry is not None and expiry <= now:
                            continue
                        w.add(name, key, ns, uk, value, expiry)
        for name, parts in self._pending.items():
            for kg, rows in parts:
                w = writer(kg)
                for row in rows.to_pylist():
                    w.add(name, row["key"], row["namespace"], row["user_key"], row["value"], row["expiry"])
        for domain, timers in self._timers:
            name = TIMER_STATES[domain]
            for tm in timers:
                writer(tm.key_group).add(name, tm.key, tm.namespace, None, tm.timestamp.to_bytes(_TS, "big", signed=True), None)
        inline = {kg: blob for kg, w in sorted(writers.items()) if (blob := w.finish())}
        return {
            "backend": "hashmap",
            "format": "canonical",
            "version": FORMAT_VERSION,
            "key_groups": [self._be.key_groups.start, self._be.key_groups.end],
            "states": {n: m.to_plain() for n, m in self._meta.items()},
            "groups": inline,
        }


class HashMapStateBackend(StateBackend):
    """The hashmap state backend: keyed state in memory, full snapshots in the canonical format."""

    def __init__(self, config: StateBackendConfig | None = None) -> None:
        super().__init__(config or StateBackendConfig())

    def create_keyed_backend(
        self,
        owner: str,
        key_groups: KeyGroupRange,
        max_parallelism: int,
        transfer: FileTransfer,
        clock: Callable[[], int] | None = None,
    ) -> HashMapKeyedStateBackend:
        return HashMapKeyedStateBackend(key_groups, max_parallelism, transfer, StatePaths(owner), clock)
