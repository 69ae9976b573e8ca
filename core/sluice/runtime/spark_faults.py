"""Fault injection on the Spark runtime: crash plans shipped to slots, crashes that kill a slot's worker.

The driver's :class:`SparkFaultInjector` holds a list of :class:`SlotCrash`; every attempt ships the crashes
of that attempt to the slots, where :class:`SlotFaults` counts hits per point in its slot and, at the armed
hit, kills the slot's Python worker with SIGKILL (``how="kill"``: no cleanup, no goodbye, as a lost
executor) or raises :class:`InjectedFault` (``how="raise"``: the engine's failure path).

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
from sluice.runtime.faults import POINTS, FaultInjector, InjectedFault

__all__ = ["SlotCrash", "SlotFaults", "SparkFaultInjector", "crashes_for_attempt"]


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


class SparkFaultInjector(FaultInjector):
    """The driver-side holder of a crash plan for the Spark runtime (nothing fires in the driver).

    ``fired`` lists the crashes slots reported right before crashing.
    """

    def __init__(self, crashes: Iterable[SlotCrash]) -> None:
        super().__init__()
        self.crashes = list(crashes)

    def for_attempt(self, attempt: int) -> list[SlotCrash]:
        return [c for c in self.crashes if c.attempt == attempt]


def crashes_for_attempt(faults: FaultInjector | None, attempt: int) -> list[SlotCrash]:
    """The crashes to ship for ``attempt``. A plain FaultInjector's plan maps to one crash per attempt
    (its i-th armed crash in attempt i, in slot 0, raising InjectedFault as in-process)."""
    if faults is None:
        return []
    if isinstance(faults, SparkFaultInjector):
        return faults.for_attempt(attempt)
    plan = getattr(faults, "_spark_plan", None)
    if plan is None:
        plan = ([(faults.point, faults.after)] if faults.point else []) + list(faults.plan)
        faults._spark_plan = plan  # type: ignore[attr-defined]
    if attempt < len(plan):
        point, after = plan[attempt]
        return [SlotCrash(point, after, attempt, 0, "raise")]
    return []


class SlotFaults(FaultInjector):
    """The slot-side injector: counts hits of each armed point in this slot and crashes at the armed one.

    Args:
        crashes: this slot's crashes for this attempt.
        before_crash: called with a description right before crashing (reports it to the driver).
    """

    def __init__(self, crashes: list[SlotCrash], before_crash: Callable[[str], None]) -> None:
        super().__init__()
        self.crashes = crashes
        self._before = before_crash
        self._counts: dict[str, int] = {}
        self._slot_lock = threading.Lock()

    def hit(self, point: str, where: str = "") -> None:
        armed = [c for c in self.crashes if c.point == point]
        if not armed:
            return
        with self._slot_lock:
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
