"""Fault injection on the Spark runtime: crash plans shipped to slots, crashes that kill a slot's worker.

The driver's :class:`SparkFaultInjector` holds a list of :class:`SlotCrash`; every attempt ships the crashes
of that attempt to the slots (:class:`SlotCrashes`), where :class:`SlotFaults` counts hits per point in its
slot and, at the armed hit, kills the slot's Python worker with SIGKILL (``how="kill"``: no cleanup, no
goodbye, as a lost executor) or raises :class:`~sluice.testing.injected.InjectedFault` (``how="raise"``).

A slot records a crash before it crashes, twice: in a file of the injector's folder (written and synced
before the kill, so a test on one machine always knows what fired) and in a message to the driver (which a
killed process's connection may lose: a reset discards data the driver had not read yet).

Example::

    faults = SparkFaultInjector([SlotCrash("process", after=20, attempt=0, slot=1)])
    p.run(runtime="spark", faults=faults)
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from sluice.errors import ConfigError
from sluice.runtime.fault_hook import POINTS, FaultHook
from sluice.testing.injected import InjectedFault

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
    #: where slots record what fired (a folder on this machine), or None
    directory: str | None = None

    def hit(self, point: str, where: str = "") -> None:
        return None

    def for_attempt(self, attempt: int) -> FaultHook | None:
        return None

    def in_slot(self, slot: int, report: Callable[[str], None]) -> FaultHook | None:
        mine = [c for c in self.crashes if c.slot == slot]
        return SlotFaults(mine, report, self.directory) if mine else None

    def record(self, description: str) -> None:
        return None


class SparkFaultInjector:
    """The driver-side holder of a crash plan for the Spark runtime (nothing fires in the driver).

    ``fired`` lists the crashes slots recorded right before crashing.

    Args:
        crashes: the plan.
        directory: a folder the slots can write (the default: a new temporary folder, which suits every slot
            on this machine); None: only the driver's messages count.
    """

    def __init__(self, crashes: Iterable[SlotCrash], directory: str | None = "") -> None:
        self.crashes = list(crashes)
        self.directory = tempfile.mkdtemp(prefix="sluice-slot-faults-") if directory == "" else directory
        self._reported: list[str] = []

    @property
    def fired(self) -> list[str]:
        """Every crash that fired, once: those recorded in the folder, and those reported by message."""
        recorded: list[str] = []
        if self.directory is not None and os.path.isdir(self.directory):
            for name in sorted(os.listdir(self.directory)):
                with open(os.path.join(self.directory, name)) as f:
                    recorded.append(f.read())
        return recorded + [d for d in self._reported if d not in recorded]

    def hit(self, point: str, where: str = "") -> None:
        return None

    def for_attempt(self, attempt: int) -> FaultHook | None:
        mine = tuple(c for c in self.crashes if c.attempt == attempt)
        return SlotCrashes(mine, self.directory) if mine else None

    def in_slot(self, slot: int, report: Callable[[str], None]) -> FaultHook | None:
        return None

    def record(self, description: str) -> None:
        self._reported.append(description)


class SlotFaults:
    """The slot-side injector: counts hits of each armed point in this slot and crashes at the armed one.

    Args:
        crashes: this slot's crashes for this attempt.
        before_crash: called with a description right before crashing (reports it to the driver).
    """

    def __init__(
        self, crashes: list[SlotCrash], before_crash: Callable[[str], None], directory: str | None = None
    ) -> None:
        self.crashes = crashes
        self.fired: list[str] = []
        self._before = before_crash
        self._directory = directory
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
            if self._directory is not None:
                self._write(desc, crash)
            self._before(desc)
            if crash.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
        raise InjectedFault(f"injected fault at {point} in {where}")

    def _write(self, desc: str, crash: SlotCrash) -> None:
        assert self._directory is not None
        name = f"a{crash.attempt:03d}-s{crash.slot:03d}-{crash.point}-{crash.after:05d}"
        tmp = os.path.join(self._directory, f".{name}.{os.getpid()}")
        with open(tmp, "w") as f:
            f.write(desc)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(self._directory, name))

    def for_attempt(self, attempt: int) -> FaultHook | None:
        return None

    def in_slot(self, slot: int, report: Callable[[str], None]) -> FaultHook | None:
        return None

    def record(self, description: str) -> None:
        return None
