"""Event- and processing-time timers of one keyed operator, by key group (restored per key group)."""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import Any

from sluice.state.keygroups import KeyGroupRange

__all__ = ["KeyedTimers"]


class KeyedTimers:
    """Event- and processing-time timers of one operator, by key group, deduplicated."""

    EVENT, PROC = 0, 1

    def __init__(self) -> None:
        self._heaps: tuple[list[tuple[int, int, int, Any]], list[tuple[int, int, int, Any]]] = ([], [])
        self._live: set[tuple[int, int, Any]] = set()  # (domain, ts, key)
        self._seq = 0

    def register(self, domain: int, ts: int, kg: int, key: Any) -> None:
        ident = (domain, ts, key)
        if ident not in self._live:
            self._live.add(ident)
            self._seq += 1
            heapq.heappush(self._heaps[domain], (ts, self._seq, kg, key))

    def delete(self, domain: int, ts: int, key: Any) -> None:
        self._live.discard((domain, ts, key))

    def pop_due(self, domain: int, upto: int) -> Iterable[tuple[int, int, Any]]:
        heap = self._heaps[domain]
        while heap and heap[0][0] <= upto:
            ts, _, kg, key = heapq.heappop(heap)
            if (domain, ts, key) in self._live:
                self._live.discard((domain, ts, key))
                yield ts, kg, key

    def next_ts(self, domain: int) -> int | None:
        heap = self._heaps[domain]
        while heap and (domain, heap[0][0], heap[0][3]) not in self._live:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def snapshot(self) -> list[tuple[int, int, int, Any]]:
        return [
            (d, ts, kg, key)
            for d in (0, 1)
            for ts, _, kg, key in self._heaps[d]
            if (d, ts, key) in self._live
        ]

    def restore(self, entries: Iterable[tuple[int, int, int, Any]], key_groups: KeyGroupRange) -> None:
        for d, ts, kg, key in entries:
            if kg in key_groups:
                self.register(d, ts, kg, key)
