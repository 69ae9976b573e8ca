"""The engine's only view of fault injection: named points where a hook may simulate a crash.

Production code calls ``hook.hit(point, where)`` at the points in :data:`POINTS`; the default,
:data:`NO_FAULTS`, does nothing. The injectors that tests arm live in :mod:`sluice.testing.faults`; they
raise an exception that derives from ``BaseException`` (as ``SystemExit`` does), so no ``except Exception``
in the engine (retries, declines) treats a simulated crash as an ordinary, recoverable error.

On Spark a hook is shipped to the slots of each attempt: :meth:`FaultHook.for_attempt` gives the picklable
part for attempt n, :meth:`FaultHook.in_slot` binds it in a slot, and :meth:`FaultHook.record` tells the
driver's hook what fired in a slot.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

__all__ = ["NO_FAULTS", "POINTS", "FaultHook", "NoFaults"]

#: the points where the engine calls :meth:`FaultHook.hit`
POINTS = (
    "process",  # a task processes a batch from an input channel
    "source",  # a source reader emitted a batch
    "align",  # a barrier arrived and the task is still aligning
    "pre_commit",  # a sink writer's pre-commit is half done (data written, not yet durable or prepared)
    "snapshot_to_ack",  # state uploaded, acknowledgement not yet sent
    "complete_to_commit",  # checkpoint complete, sink has not committed yet
    "global_commit",  # checkpoint complete (metadata written), its global commit not yet done
    "commit",  # in the middle of committing (after the first committable)
    "restore",  # a task is restoring its state
    "channel_state",  # writing unaligned channel state
    "compaction",  # a file sink compacts files
    "final_checkpoint",  # the final checkpoint completed, the task has not finished yet
    "listening",  # Spark: a listener is up (the driver's control server; a slot's data plane, as the
    # driver learns its address before telling the other slots); where = "... HOST:PORT"
)


class FaultHook(Protocol):
    """Called by the engine at named points; may raise to simulate a crash there."""

    def hit(self, point: str, where: str = "") -> None:
        """The engine reached ``point`` in ``where`` (a task name)."""

    def for_attempt(self, attempt: int) -> FaultHook | None:
        """The picklable hook to ship to the slots of ``attempt`` (Spark), or None if nothing is armed."""

    def in_slot(self, slot: int, report: Callable[[str], None]) -> FaultHook | None:
        """This shipped hook, bound in slot ``slot``; ``report`` tells the driver a fault fired."""

    def record(self, description: str) -> None:
        """Driver side: a fault fired in a slot."""


class NoFaults:
    """The default hook: nothing is armed."""

    def hit(self, point: str, where: str = "") -> None:
        return None

    def for_attempt(self, attempt: int) -> FaultHook | None:
        return None

    def in_slot(self, slot: int, report: Callable[[str], None]) -> FaultHook | None:
        return None

    def record(self, description: str) -> None:
        return None


NO_FAULTS: FaultHook = NoFaults()
