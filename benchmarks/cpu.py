"""How many cores the whole machine kept busy over a span: ``/proc/stat`` sampled in a thread.

A figure like "2 slots vs 1 slot" is bounded by the cores left over: if one slot (with the broker and the
driver beside it) already keeps 1.3 of 2 cores busy, a second slot can add at most 0.7. The benchmarks
print this figure next to their throughput so a ratio can be read against it.
"""

from __future__ import annotations

import os
import threading
import time
from types import TracebackType


def _busy_total() -> tuple[int, int]:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal
    return total - idle, total


class CpuSampler:
    """``with CpuSampler() as cpu: ...`` then ``cpu.cores_busy(t0, t1)`` for wall-clock times in the span."""

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self.samples: list[tuple[float, int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def _run(self) -> None:
        while True:
            self.samples.append((time.time(), *_busy_total()))
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append((time.time(), *_busy_total()))

    def cores_busy(self, t0: float, t1: float) -> float:
        """Mean busy cores of the whole machine between the samples nearest inside [t0, t1]."""
        inside = [s for s in self.samples if t0 <= s[0] <= t1] or self.samples
        (_, b0, n0), (_, b1, n1) = inside[0], inside[-1]
        return (b1 - b0) / max(1, n1 - n0) * (os.cpu_count() or 1)
