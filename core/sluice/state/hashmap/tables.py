"""The hashmap backend's building blocks: copy-on-write tables and heap timers."""

from __future__ import annotations

import copy
import heapq
from collections.abc import Callable, Iterator
from typing import Any

from sluice.state.spi import TimeDomain, Timer, TimerService

__all__ = ["HeapTimerService", "Table"]


class Table:
    """One key group's entries of one state, with copy-on-write bookkeeping.

    A snapshot *freezes* the table (``shared``): the first write afterwards copies the dict, and the first
    in-place change of a list or map value copies that value (``owned`` are the keys already copied).
    """

    __slots__ = ("data", "owned", "shared")

    def __init__(self, data: dict[bytes, Any] | None = None) -> None:
        self.data: dict[bytes, Any] = data if data is not None else {}
        self.shared = False
        self.owned: set[bytes] | None = None

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

    def delete(self, key: bytes) -> None:
        """Remove ``key`` if present."""
        if key in self.data:
            del self.writable()[key]

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
        return value

    def freeze(self) -> dict[bytes, Any]:
        """Hand the dict to a snapshot: later writes copy first."""
        self.shared = True
        self.owned = None
        return self.data


class HeapTimerService(TimerService):
    """Timers in memory: a heap per time domain, deduplicated, deleted lazily."""

    def __init__(self) -> None:
        self._heaps: tuple[list[tuple[int, int, bytes, bytes]], ...] = ([], [])
        self._live: tuple[set[tuple[int, bytes, bytes]], ...] = (set(), set())

    def register(self, domain: TimeDomain, timestamp: int, key_group: int, key: bytes, namespace: bytes = b"") -> None:
        ident = (timestamp, key, namespace)
        live = self._live[domain]
        if ident not in live:
            live.add(ident)
            heapq.heappush(self._heaps[domain], (timestamp, key_group, key, namespace))

    def delete(self, domain: TimeDomain, timestamp: int, key_group: int, key: bytes, namespace: bytes = b"") -> None:
        self._live[domain].discard((timestamp, key, namespace))

    def pop_due(self, domain: TimeDomain, upto: int) -> list[Timer]:
        heap, live, out = self._heaps[domain], self._live[domain], []
        while heap and heap[0][0] <= upto:
            ts, kg, key, ns = heapq.heappop(heap)
            if (ts, key, ns) in live:
                live.discard((ts, key, ns))
                out.append(Timer(ts, kg, key, ns))
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
