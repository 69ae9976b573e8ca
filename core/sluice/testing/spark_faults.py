"""Fault injection on the Spark runtime: crash plans shipped to slots, crashes that kill a slot's worker.

The driver's :class:`SparkFaultInjector` holds a list of :class:`SlotCrash`; every attempt ships the crashes
of that attempt to the slots (:class:`SlotCrashes`), where :class:`SlotFaults` counts hits per point in its
slot and, at the armed hit, kills the slot's Python worker with SIGKILL (``how="kill"``: no cleanup, no
goodbye, as a lost executor) or raises :class:`~sluice.testing.faults.InjectedFault` (``how="raise"``).

Example::

    faults = SparkFaultInjector([SlotCrash("process", after=20, attempt=0, slot=1)])
    p.run(runtime="spark", faults=faults)
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from sluice.errors import ConfigError
from sluice.runtime.fault_hook import POINTS, FaultHook
from sluice.testing.faults import InjectedFault

__all__ = ["SlotCrash", "SlotCrashes", "SlotFaults", "SparkFaultInjector"]


@dataclass(frozen=True)
class SlotCrash:
    """Crash slot ``slot`` at the ``after``-th hit (0-based) of ``point`` in its subtasks, in ``attempt`` only.

    Slot ``slot`` hosts subtask ``slot`` of every vertex whose parallelism exceeds it; slot 0 hosts a subtask
    of every vertex, so every point the job reaches is reachable there.
    """

    point: str
    after: int = 0
    attempt: int = 0
    slot: int = 0
    how: Literal["kill", "raise"] = "kill"

    def __post_init__(self) -> None:
        if self.point not in POINTS:
            raise ConfigError(f"SlotCrash: point must be one of {POINTS} (got {self.point!r})")
        if self.how not in ("kill", "raise"):
            raise ConfigError(f"SlotCrash: how must be 'kill' or 'raise' (got {self.how!r})")


@dataclass(frozen=True)
class SlotCrashes:
    """The picklable crash plan of one attempt, shipped to every slot (nothing fires until bound)."""

    crashes: tuple[SlotCrash, ...]

    def hit(self, point: str, where: str = "") -> None:
        return None

    def for_attempt(self, attempt: int) -> FaultHook | None:
        return None

    def in_slot(self, slot: int, report: Callable[[str], None]) -> FaultHook | None:
        mine = [c for c in self.crashes if c.slot == slot]
        return SlotFaults(mine, report) if mine else None

    def record(self, description: str) -> None:
        return None


class SparkFaultInjector:
    """The driver-side holder of a crash plan for the Spark runtime (nothing fires in the driver).

    ``fired`` lists the crashes slots reported right before crashing.
    """

    def __init__(self, crashes: Iterable[SlotCrash]) -> None:
        self.crashes = list(crashes)
        self.fired: list[str] = []

    def hit(self, point: str, where: str = "") -> None:
        return None

    def for_attempt(self, attempt: int) -> FaultHook | None:
        mine = tuple(c for c in self.crashes if c.attempt == attempt)
        return SlotCrashes(mine) if mine else None

    def in_slot(self, slot: int, report: Callable[[str], None]) -> FaultHook | None:
        return None

    def record(self, description: str) -> None:
        self.fired.append(description)


class SlotFaults:
    """The slot-side injector: counts hits of each armed point in this slot and crashes at the armed one.

    Args:
        crashes: this slot's crashes for this attempt.
        before_crash: called with a description right before crashing (reports it to the driver).
    """

    def __init__(self, crashes: list[SlotCrash], before_crash: Callable[[str], None]) -> None:
        self.crashes = crashes
        self.fired: list[str] = []
        self._before = before_crash
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def hit(self, point: str, where: str = "") -> None:
        armed = [c for c in self.crashes if c.point == point]
        if not armed:
            return
        with self._lock:
            n = self._counts.get(point, 0)
            self._counts[point] = n + 1
            crash = next((c for c in armed if c.after == n), None)
            if crash is None:
                return
            desc = f"{point}@{where} (hit {n}, attempt {crash.attempt}, slot {crash.slot}, {crash.how})"
            self.fired.append(desc)
            self._before(desc)
            if crash.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
        raise InjectedFault(f"injected fault at {point} in {where}")

    def for_attempt(self, attempt: int) -> FaultHook | None:
        return None

    def in_slot(self, slot: int, report: Callable[[str], None]) -> FaultHook | None:
        return None

    def record(self, description: str) -> None:
        return None
