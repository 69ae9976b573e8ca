"""Fault injection: the engine calls :func:`FaultInjector.hit` at named points; a test arms one to crash.

Points (``POINTS``): while processing a batch, while aligning, between snapshot and ack, between checkpoint
completion and commit, while restoring, while writing channel state, during compaction.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field

__all__ = ["POINTS", "FaultInjector", "InjectedFault"]

POINTS = (
    "process",  # a task processes a batch
    "source",  # a source reader emitted a batch
    "align",  # a barrier arrived and the task is aligning
    "snapshot_to_ack",  # state uploaded, acknowledgement not yet sent
    "complete_to_commit",  # checkpoint complete, sink has not committed yet
    "commit",  # in the middle of committing (after the first committable)
    "restore",  # a task is restoring its state
    "channel_state",  # writing unaligned channel state
    "compaction",  # a file sink compacts files
    "final_checkpoint",  # a task waits for the final checkpoint
)


class InjectedFault(Exception):  # noqa: N818 - the name says what it is
    """Raised at an armed point: the test's stand-in for a crash."""


@dataclass
class FaultInjector:
    """Crashes the ``after``-th hit of ``point`` (counted over all subtasks), once per armed fault."""

    point: str | None = None
    after: int = 0
    #: only crash in this restart attempt (0 = first run); None = any
    attempt: int | None = None
    fired: list[str] = field(default_factory=list)
    _hits: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _armed: bool = True

    @classmethod
    def random(cls, rng: random.Random, points: tuple[str, ...] = POINTS, max_after: int = 30) -> FaultInjector:
        return cls(point=rng.choice(points), after=rng.randint(0, max_after), attempt=None)

    def rearm(self, point: str, after: int) -> None:
        with self._lock:
            self.point, self.after, self._hits, self._armed = point, after, 0, True

    def hit(self, point: str, where: str = "") -> None:
        if point != self.point or not self._armed:
            return
        with self._lock:
            if not self._armed:
                return
            self._hits += 1
            if self._hits <= self.after:
                return
            self._armed = False
            self.fired.append(f"{point}@{where}")
        raise InjectedFault(f"injected fault at {point} in {where}")
