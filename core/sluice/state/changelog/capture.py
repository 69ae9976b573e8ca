"""Capturing a keyed backend's changes between checkpoints, and turning them into segment rows.

Each backend records what changed since the last seal, compacted per entry:

* RocksDB: every raw entry written or deleted and its last value (``RocksDBKeyedStateBackend.change_log``,
  filled by its ``put``, ``delete`` and ``write_many``): sealing swaps the dict, O(1).
* hashmap: the keys of each (state, key group) table written since the last seal and the timers
  registered or deleted; sealing reads those entries' values now (copying list and map values), O(changes).

Encoding the sealed changes into segment rows (:mod:`sluice.state.changelog.format`) is the asynchronous
part's work.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sluice.errors import ConfigError
from sluice.state.canonical import entry_rows, split_entry_key
from sluice.state.changelog.format import HEAP_SEGMENT, OP_ADD, OP_CLEAR, ROCKSDB_SEGMENT
from sluice.state.meta import TIMER_STATES
from sluice.state.spi import KeyedStateBackend

__all__ = ["ChangeCapture", "capture_for"]


class ChangeCapture(ABC):
    """Records one keyed backend's changes; :meth:`seal` hands them over at a checkpoint."""

    #: the schema of this backend's segments
    schema: pa.Schema
    #: the backend's name in handles
    backend: str

    @abstractmethod
    def seal(self) -> tuple[Any, bool]:
        """The changes since the last seal and whether there are any (the synchronous part)."""

    @abstractmethod
    def has_changes(self) -> bool:
        """Whether anything changed since the last seal."""

    @abstractmethod
    def rows(self, changes: Any) -> pa.Table:
        """Sealed changes as segment rows, sorted by key group (the asynchronous part)."""

    @abstractmethod
    def pause(self) -> None:
        """Stop recording (while a restore writes)."""

    @abstractmethod
    def resume(self) -> None:
        """Record again, from an empty change set."""


class RocksDBChangeCapture(ChangeCapture):
    """Raw entries of a RocksDB keyed backend."""

    schema = ROCKSDB_SEGMENT
    backend = "rocksdb"

    def __init__(self, backend: Any) -> None:
        self._be = backend
        backend.change_log = {}
        backend.incremental = True  # materializations reuse the files of the last confirmed one

    def seal(self) -> tuple[Any, bool]:
        log: dict[bytes, bytes | None] = self._be.change_log
        self._be.change_log = {}
        return log, bool(log)

    def has_changes(self) -> bool:
        return bool(self._be.change_log)

    def rows(self, changes: Any) -> pa.Table:
        keys = sorted(changes)
        return pa.table(
            [
                pa.array([int.from_bytes(k[:2], "big") for k in keys], pa.uint16()),
                pa.array(keys, pa.binary()),
                pa.array([changes[k] for k in keys], pa.binary()),
            ],
            schema=self.schema,
        )

    def pause(self) -> None:
        self._be.change_log = None

    def resume(self) -> None:
        self._be.change_log = {}


class HeapChangeCapture(ChangeCapture):
    """Changed entries and timers of a hashmap keyed backend, as canonical rows with an op."""

    schema = HEAP_SEGMENT
    backend = "hashmap"

    def __init__(self, backend: Any) -> None:
        self._be = backend
        backend.capture_changes()

    def seal(self) -> tuple[Any, bool]:
        changes = self._be.take_changes()
        return changes, bool(changes[0] or changes[1])

    def has_changes(self) -> bool:
        return bool(self._be.has_changes())

    def rows(self, changes: Any) -> pa.Table:
        entries, timers, registered, _ = changes
        cols: tuple[list[Any], ...] = ([], [], [], [], [], [], [], [])

        def add(*row: Any) -> None:
            for col, v in zip(cols, row, strict=True):
                col.append(v)

        for name, kg, ek, value in entries:
            key, ns = split_entry_key(ek)
            add(kg, OP_CLEAR, name, key, ns, None, None, None)
            if value is not None:
                for uk, data, expiry in entry_rows(registered[name], value):
                    add(kg, OP_ADD, name, key, ns, uk, data, expiry)
        for domain, ts, kg, key, ns, registered_now in timers:
            name, stamp = TIMER_STATES[domain], ts.to_bytes(8, "big", signed=True)
            add(kg, OP_CLEAR, name, key, ns, None, stamp, None)
            if registered_now:
                add(kg, OP_ADD, name, key, ns, None, stamp, None)
        table = pa.table([pa.array(c, f.type) for c, f in zip(cols, self.schema, strict=True)], schema=self.schema)
        return table.take(pc.sort_indices(table.column("kg")))  # stable: an entry's clear stays before its rows

    def pause(self) -> None:
        pass  # a restore writes around the change tracking; resume() drops what it saw

    def resume(self) -> None:
        self._be.take_changes()


def capture_for(backend: KeyedStateBackend) -> ChangeCapture:
    """The change capture of a hashmap or RocksDB keyed backend (it starts recording now)."""
    if backend.backend_name == HeapChangeCapture.backend:
        return HeapChangeCapture(backend)
    if backend.backend_name == RocksDBChangeCapture.backend:
        return RocksDBChangeCapture(backend)
    raise ConfigError(
        f"changelog checkpoints need the hashmap or rocksdb state backend (got {type(backend).__name__})"
    )
