"""The hashmap backend's building blocks: copy-on-write tables and heap timers."""

from __future__ import annotations

import copy
import heapq
from collections.abc import Callable, Iterator
from typing import Any

from sluice.state.spi import TimeDomain, Timer, TimerService

__all__ = ["HeapTimerService", "Table", "TrackedTables"]


class Table:
    """One key group's entries of one state, with copy-on-write bookkeeping.

    A snapshot *freezes* the table (``shared``): the first write afterwards copies the dict, and the first
    in-place change of a list or map value copies that value (``owned`` are the keys already copied).
    With change capture on (changelog checkpoints), ``dirty`` collects the keys written since the last
    checkpoint.
    """

    __slots__ = ("data", "dirty", "owned", "shared")

    def __init__(self, data: dict[bytes, Any] | None = None) -> None:
        self.data: dict[bytes, Any] = data if data is not None else {}
        self.shared = False
        self.owned: set[bytes] | None = None
        self.dirty: set[bytes] | None = None

    def writable(self) -> dict[bytes, Any]:
        """The dict, copied first if a snapshot holds it."""
        if self.shared:
            self.data = dict(self.data)
            self.shared = False
            self.owned = set()
        return self.data

    def put(self, key: bytes, value: Any) -> None:
        """Set ``key`` (the value is owned by the table from now on)."""
        self.writable()[key] = value
        if self.owned is not None:
            self.owned.add(key)
        if self.dirty is not None:
            self.dirty.add(key)

    def delete(self, key: bytes) -> None:
        """Remove ``key`` if present."""
        if key in self.data:
            del self.writable()[key]
            if self.dirty is not None:
                self.dirty.add(key)

    def mutable(self, key: bytes, factory: Callable[[], Any]) -> Any:
        """The container value of ``key`` for an in-place change (created, or copied if a snapshot holds
        it)."""
        data = self.writable()
        value = data.get(key)
        if value is None:
            value = data[key] = factory()
            if self.owned is not None:
                self.owned.add(key)
        elif self.owned is not None and key not in self.owned:
            value = data[key] = copy.copy(value)
            self.owned.add(key)
        if self.dirty is not None:
            self.dirty.add(key)
        return value

    def freeze(self) -> dict[bytes, Any]:
        """Hand the dict to a snapshot: later writes copy first."""
        self.shared = True
        self.owned = None
        return self.data


class TrackedTables(dict[int, Table]):
    """One state's tables by key group; with ``capture`` on, a table put in starts tracking changed keys."""

    __slots__ = ("capture",)

    def __init__(self, capture: bool = False) -> None:
        super().__init__()
        self.capture = capture

    def __setitem__(self, key_group: int, table: Table) -> None:
        if self.capture and table.dirty is None:
            table.dirty = set()
        super().__setitem__(key_group, table)


class HeapTimerService(TimerService):
    """Timers in memory: a heap per time domain, deduplicated, deleted lazily.

    With change capture on, ``dirty`` collects ``(domain, timestamp, key group, key, namespace)`` of the
    timers registered or deleted since the last checkpoint.
    """

    def __init__(self) -> None:
        self._heaps: tuple[list[tuple[int, int, bytes, bytes]], ...] = ([], [])
        self._live: tuple[set[tuple[int, bytes, bytes]], ...] = (set(), set())
        self.dirty: set[tuple[int, int, int, bytes, bytes]] | None = None

    def register(self, domain: TimeDomain, timestamp: int, key_group: int, key: bytes, namespace: bytes = b"") -> None:
        ident = (timestamp, key, namespace)
        live = self._live[domain]
        if ident not in live:
            live.add(ident)
            heapq.heappush(self._heaps[domain], (timestamp, key_group, key, namespace))
            if self.dirty is not None:
                self.dirty.add((int(domain), timestamp, key_group, key, namespace))

    def delete(self, domain: TimeDomain, timestamp: int, key_group: int, key: bytes, namespace: bytes = b"") -> None:
        live = self._live[domain]
        if (timestamp, key, namespace) in live:
            live.discard((timestamp, key, namespace))
            if self.dirty is not None:
                self.dirty.add((int(domain), timestamp, key_group, key, namespace))

    def is_registered(self, domain: TimeDomain, timestamp: int, key: bytes, namespace: bytes = b"") -> bool:
        """Whether the timer is registered."""
        return (timestamp, key, namespace) in self._live[domain]

    def pop_due(self, domain: TimeDomain, upto: int) -> list[Timer]:
        heap, live, out = self._heaps[domain], self._live[domain], []
        while heap and heap[0][0] <= upto:
            ts, kg, key, ns = heapq.heappop(heap)
            if (ts, key, ns) in live:
                live.discard((ts, key, ns))
                out.append(Timer(ts, kg, key, ns))
                if self.dirty is not None:
                    self.dirty.add((int(domain), ts, kg, key, ns))
        return out

    def next_timestamp(self, domain: TimeDomain) -> int | None:
        heap, live = self._heaps[domain], self._live[domain]
        while heap and (heap[0][0], heap[0][2], heap[0][3]) not in live:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def timers(self, domain: TimeDomain) -> Iterator[Timer]:
        live = self._live[domain]
        seen: set[tuple[int, bytes, bytes]] = set()
        for ts, kg, key, ns in list(self._heaps[domain]):
            if (ts, key, ns) in live and (ts, key, ns) not in seen:
                seen.add((ts, key, ns))
                yield Timer(ts, kg, key, ns)
