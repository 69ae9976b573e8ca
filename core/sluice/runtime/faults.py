"""Fault injection: the engine calls :meth:`FaultInjector.hit` at named points; a test arms crashes there.

Points (``POINTS``): while processing a batch, while aligning, between snapshot and ack, between checkpoint
completion and commit, in the middle of a commit, while restoring, while writing channel state, during
compaction, while waiting for the final checkpoint.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field

__all__ = ["POINTS", "FaultInjector", "InjectedFault"]

POINTS = (
    "process",  # a task processes a batch from an input channel
    "source",  # a source reader emitted a batch
    "align",  # a barrier arrived and the task is still aligning
    "snapshot_to_ack",  # state uploaded, acknowledgement not yet sent
    "complete_to_commit",  # checkpoint complete, sink has not committed yet
    "commit",  # in the middle of committing (after the first committable)
    "restore",  # a task is restoring its state
    "channel_state",  # writing unaligned channel state
    "compaction",  # a file sink compacts files
    "final_checkpoint",  # the final checkpoint completed, the task has not finished yet
)


class InjectedFault(Exception):
    """Raised at an armed point: the test's stand-in for a crash."""


@dataclass
class FaultInjector:
    """Crashes at the ``after``-th hit (0-based) of ``point``, counted over all subtasks.

    ``plan`` arms several crashes one after another: ``[("process", 5), ("restore", 0)]`` crashes while
    processing, then again while restoring from that crash.
    """

    point: str | None = None
    after: int = 0
    plan: list[tuple[str, int]] = field(default_factory=list)
    fired: list[str] = field(default_factory=list)
    _hits: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.point is not None:
            self.plan.insert(0, (self.point, self.after))
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
