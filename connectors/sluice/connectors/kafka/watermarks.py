"""Per-partition watermarks with bounded out-of-orderness and idleness, combined by minimum.

Each partition's watermark is ``max timestamp seen - bound``. A partition that has not received a record
for longer than ``idle_timeout`` is left out of the minimum (so one quiet partition does not stall event
time); a partition that has never received a record holds the watermark back until it counts as idle.
Finished (bounded) partitions are left out. When every partition is idle, no watermark is emitted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["PartitionWatermarks"]


@dataclass
class _Partition:
    max_ts: int | None
    last_active: float


class PartitionWatermarks:
    """Tracks the event-time progress of a reader's partitions.

    Args:
        bound_ms: maximum out-of-orderness in milliseconds.
        idle_timeout_s: seconds without records after which a partition is idle; None = never idle.
        clock: monotonic clock in seconds (injectable for tests).
    """

    def __init__(
        self, bound_ms: int, idle_timeout_s: float | None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.bound_ms = bound_ms
        self.idle_timeout_s = idle_timeout_s
        self.clock = clock
        self._parts: dict[str, _Partition] = {}

    def add(self, split: str) -> None:
        """Start tracking ``split`` (it holds the watermark back until it has records or is idle)."""
        self._parts.setdefault(split, _Partition(None, self.clock()))

    def remove(self, split: str) -> None:
        """Stop tracking ``split`` (finished)."""
        self._parts.pop(split, None)

    def update(self, split: str, max_ts: int) -> None:
        """Records up to timestamp ``max_ts`` were read from ``split``."""
        p = self._parts.get(split)
        if p is None:
            p = self._parts[split] = _Partition(None, 0.0)
        if p.max_ts is None or max_ts > p.max_ts:
            p.max_ts = max_ts
        p.last_active = self.clock()

    def all_idle(self) -> bool:
        """True when every tracked partition has been idle for ``idle_timeout_s``."""
        if self.idle_timeout_s is None or not self._parts:
            return False
        now = self.clock()
        return all(now - p.last_active >= self.idle_timeout_s for p in self._parts.values())

    def current(self) -> int | None:
        """The combined watermark, or None while it cannot advance."""
        now = self.clock()
        active: list[int | None] = [
            p.max_ts
            for p in self._parts.values()
            if self.idle_timeout_s is None or now - p.last_active < self.idle_timeout_s
        ]
        if not active or any(ts is None for ts in active):
            return None
        return min(ts for ts in active if ts is not None) - self.bound_ms
