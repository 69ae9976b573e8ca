"""Fault injection for tests: act at the n-th hit of a named point, counted over all subtasks.

The engine calls :meth:`FaultInjector.hit` at the points of :data:`POINTS` (see
:mod:`sluice.runtime.fault_hook`). What an armed point does is its kind:

* ``"crash"`` raises :class:`InjectedFault`, the test's stand-in for a crash (the attempt fails, the job
  restarts from its latest completed checkpoint);
* ``"decline"`` (at ``snapshot_to_ack``) raises :class:`InjectedDecline`, an ordinary error, so the task
  declines that checkpoint and the job goes on if ``tolerable_failed_checkpoints`` allows;
* ``"stall"`` (at ``snapshot_to_ack``) sleeps ``stall_s`` in the asynchronous part, so the checkpoint
  expires and the job goes on.

:class:`HitCounter` counts hits per point in a failure-free run, so plans arm only points a run reaches.
On the Spark runtime a plain injector's plan maps to one raising crash per attempt in slot 0
(:mod:`sluice.testing.spark_faults` ships it).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from sluice.runtime.fault_hook import POINTS, FaultHook
from sluice.testing.injected import InjectedDecline, InjectedFault

__all__ = ["KINDS", "POINTS", "FaultInjector", "HitCounter", "InjectedDecline", "InjectedFault", "PlannedFault"]

Kind = Literal["crash", "decline", "stall"]
#: what an armed point does (see the module docstring)
KINDS: tuple[Kind, ...] = ("crash", "decline", "stall")


@dataclass(frozen=True)
class PlannedFault:
    """One armed fault: ``kind`` at the ``after``-th hit (0-based) of ``point``."""

    point: str
    after: int = 0
    kind: Kind = "crash"

    def __post_init__(self) -> None:
        if self.point not in POINTS:
            raise ValueError(f"PlannedFault: point must be one of {POINTS} (got {self.point!r})")
        if self.kind not in KINDS:
            raise ValueError(f"PlannedFault: kind must be one of {KINDS} (got {self.kind!r})")
        if self.kind != "crash" and self.point != "snapshot_to_ack":
            raise ValueError(f"PlannedFault: a {self.kind!r} fault acts only at 'snapshot_to_ack'")


@dataclass
class FaultInjector:
    """Acts at the ``after``-th hit (0-based) of ``point``, counted over all subtasks.

    ``plan`` arms several faults one after another (each counts hits from the moment it is armed):
    ``[("process", 5), ("restore", 0)]`` crashes while processing, then again while restoring from that
    crash; entries may be :class:`PlannedFault` for other kinds. ``fired`` lists what happened, ``crashes``
    how many of those were crashes.
    """

    point: str | None = None
    after: int = 0
    plan: Sequence[tuple[str, int] | PlannedFault] = field(default_factory=list)
    fired: list[str] = field(default_factory=list)
    crashes: int = 0
    stall_s: float = 1.0
    _kind: Kind = "crash"
    _hits: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _spark_plan: list[tuple[str, int]] | None = None

    def __post_init__(self) -> None:
        if self.point is not None:
            self.plan = [(self.point, self.after), *self.plan]
        self._queue = [p if isinstance(p, PlannedFault) else PlannedFault(*p) for p in self.plan]
        self.armed = len(self._queue)
        self._spark_plan = [(p.point, p.after) for p in self._queue if p.kind == "crash"]
        self._next()

    def _next(self) -> None:
        if self._queue:
            nxt = self._queue.pop(0)
            self.point, self.after, self._kind = nxt.point, nxt.after, nxt.kind
        else:
            self.point = None
        self._hits = 0

    @classmethod
    def random(
        cls, rng: random.Random, points: tuple[str, ...] | None = None, max_after: int = 30, crashes: int = 1
    ) -> FaultInjector:
        """``crashes`` random crashes (a "restore" crash always follows another one) at ``points`` (default:
        every point both runtimes reach, so not ``listening``, which only the Spark driver hits)."""
        points = points or tuple(p for p in POINTS if p != "listening")
        plan: list[tuple[str, int]] = []
        for _ in range(crashes):
            p = rng.choice(points)
            if p == "restore" and not plan:
                plan.append(("process", rng.randint(0, max_after)))
            plan.append((p, 0 if p == "restore" else rng.randint(0, max_after)))
        return cls(plan=plan)

    @property
    def all_fired(self) -> bool:
        """Every armed fault acted."""
        return len(self.fired) == self.armed

    def hit(self, point: str, where: str = "") -> None:
        if point != self.point:
            return
        with self._lock:
            if point != self.point:
                return
            self._hits += 1
            if self._hits <= self.after:
                return
            kind = self._kind
            self.fired.append(f"{kind}:{point}@{where}")
            self.crashes += kind == "crash"
            self._next()
        if kind == "stall":
            time.sleep(self.stall_s)
        elif kind == "decline":
            raise InjectedDecline(f"injected decline at {point} in {where}")
        else:
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


class HitCounter:
    """A hook that never acts and counts hits per point (for plans that arm only reachable points)."""

    def __init__(self) -> None:
        self.hits: dict[str, int] = {}
        self._lock = threading.Lock()

    def hit(self, point: str, where: str = "") -> None:
        with self._lock:
            self.hits[point] = self.hits.get(point, 0) + 1

    def for_attempt(self, attempt: int) -> FaultHook | None:
        return None

    def in_slot(self, slot: int, report: Callable[[str], None]) -> FaultHook | None:
        return None

    def record(self, description: str) -> None:
        return None
