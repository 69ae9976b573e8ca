"""Fault injection for tests: crash at the n-th hit of a named point, counted over all subtasks.

The engine calls :meth:`FaultInjector.hit` at the points of :data:`POINTS` (see
:mod:`sluice.runtime.fault_hook`); an armed point raises :class:`InjectedFault`, the test's stand-in for
a crash. On the Spark runtime a plain injector's plan maps to one raising crash per attempt in slot 0
(:mod:`sluice.testing.spark_faults` ships it).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from sluice.runtime.fault_hook import POINTS, FaultHook

__all__ = ["POINTS", "FaultInjector", "InjectedFault"]


class InjectedFault(BaseException):
    """Raised at an armed point: the test's stand-in for a crash.

    It derives from ``BaseException``, like ``SystemExit``: a crashing process runs no ``except Exception``
    handler, so neither may a simulated crash (commit retries, checkpoint declines).
    """


@dataclass
class FaultInjector:
    """Crashes at the ``after``-th hit (0-based) of ``point``, counted over all subtasks.

    ``plan`` arms several crashes one after another: ``[("process", 5), ("restore", 0)]`` crashes while
    processing, then again while restoring from that crash. ``fired`` lists the crashes that happened.
    """

    point: str | None = None
    after: int = 0
    plan: list[tuple[str, int]] = field(default_factory=list)
    fired: list[str] = field(default_factory=list)
    _hits: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _spark_plan: list[tuple[str, int]] | None = None

    def __post_init__(self) -> None:
        if self.point is not None:
            self.plan.insert(0, (self.point, self.after))
        self._spark_plan = list(self.plan)
        self._next()

    def _next(self) -> None:
        if self.plan:
            self.point, self.after = self.plan.pop(0)
        else:
            self.point = None
        self._hits = 0

    @classmethod
    def random(
        cls, rng: random.Random, points: tuple[str, ...] = POINTS, max_after: int = 30, crashes: int = 1
    ) -> FaultInjector:
        """``crashes`` random crashes (a "restore" crash always follows another one)."""
        plan: list[tuple[str, int]] = []
        for _ in range(crashes):
            p = rng.choice(points)
            if p == "restore" and not plan:
                plan.append(("process", rng.randint(0, max_after)))
            plan.append((p, 0 if p == "restore" else rng.randint(0, max_after)))
        return cls(plan=plan)

    def hit(self, point: str, where: str = "") -> None:
        if point != self.point:
            return
        with self._lock:
            if point != self.point:
                return
            self._hits += 1
            if self._hits <= self.after:
                return
            self.fired.append(f"{point}@{where}")
            self._next()
        raise InjectedFault(f"injected fault at {point} in {where}")

    # -- the Spark runtime: the i-th armed crash raises in slot 0 of attempt i -----------------------
    def for_attempt(self, attempt: int) -> FaultHook | None:
        from sluice.testing.spark_faults import SlotCrash, SlotCrashes

        plan = self._spark_plan or []
        if attempt < len(plan):
            point, after = plan[attempt]
            return SlotCrashes((SlotCrash(point, after, attempt, 0, "raise"),))
        return None

    def in_slot(self, slot: int, report: Callable[[str], None]) -> FaultHook | None:
        return None

    def record(self, description: str) -> None:
        self.fired.append(description)
