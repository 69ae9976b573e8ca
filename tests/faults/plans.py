"""Fault plans that fire: points are drawn among those a failure-free run of the same shape and mode reached.

A :class:`~sluice.testing.faults.HitCounter` run of the scenario's shape, seed and mode counts hits per
point. A crash is armed at a point that run reached, at a hit well inside the count (runs differ in timing,
so counts are not exact). Points hit per checkpoint (alignment, channel state, snapshots, completions) are
armed within the first ``LINGER_CHECKPOINTS`` hits: the shapes' sources end their input only after that
many checkpoints completed, so every run reaches them that often, on an idle or a loaded machine; a commit
with data is certain once, so ``commit`` is armed at its first hit. Second faults follow rules that keep them reachable after the first crash's restore:

* every restarted run ends with a final checkpoint: ``snapshot_to_ack`` and ``final_checkpoint`` fire;
* ``restore`` follows only a crash after a completed checkpoint (``global_commit``, ``complete_to_commit``,
  ``commit``, ``final_checkpoint``), so there is something to restore;
* ``process`` / ``source`` follow only a crash while processing / reading: the crashed batch is replayed
  (after any other crash, everything may have been read and checkpointed already).
"""

from __future__ import annotations

import random
from typing import Any

from sluice.testing.faults import FaultInjector, PlannedFault
from sluice.testing.spark_faults import SlotCrash, SparkFaultInjector

from tests.faults.shapes import LINGER_CHECKPOINTS

#: crash points per alignment mode (compaction belongs to the file sink's own suite)
MODE_POINTS = {
    "aligned": (
        "process", "source", "align", "snapshot_to_ack", "global_commit", "complete_to_commit", "commit",
        "final_checkpoint",
    ),
    "unaligned": (
        "process", "source", "align", "snapshot_to_ack", "global_commit", "complete_to_commit", "commit",
        "channel_state", "final_checkpoint",
    ),
    # whether an adaptive checkpoint switches (records channel state, pulls barriers forward instead of
    # aligning on them) depends on timing
    "adaptive": (
        "process", "source", "snapshot_to_ack", "global_commit", "complete_to_commit", "commit", "final_checkpoint"
    ),
    "at_least_once": ("process", "source", "snapshot_to_ack", "complete_to_commit", "commit", "final_checkpoint"),
}
#: points hit once per batch: counts barely depend on timing
_PER_BATCH = ("process", "source")
#: points hit only while a checkpoint meets live input channels: a run may see none where another saw a few
_SPARSE = ("align", "channel_state")
_AFTER_COMPLETION = ("global_commit", "complete_to_commit", "commit", "final_checkpoint")


def _first(rng: random.Random, point: str, count: int) -> PlannedFault:
    if point == "final_checkpoint":
        return PlannedFault(point, rng.randint(0, count - 1))
    if point in _PER_BATCH:
        return PlannedFault(point, rng.randint(0, max(0, count // 2 - 1)))
    guaranteed = 1 if point == "commit" else LINGER_CHECKPOINTS
    share = 8 if point in _SPARSE else 4
    return PlannedFault(point, rng.randint(0, max(0, min(count // share, guaranteed) - 1)))


def reachable(point: str, count: int) -> bool:
    """Whether a crash can be armed at ``point``, which a failure-free run reached ``count`` times."""
    return count >= 4 if point in _SPARSE else count > 0


def crash_plan(rng: random.Random, hits: dict[str, int], mode: str, crashes: int) -> list[PlannedFault]:
    """``crashes`` (1 or 2) crashes at points ``hits`` shows reachable in ``mode``."""
    points = [p for p in MODE_POINTS[mode] if reachable(p, hits.get(p, 0))]
    assert points, f"no fault point was reached: {hits}"
    point = rng.choice(points)
    plan = [_first(rng, point, hits[point])]
    if crashes > 1:
        options = ["snapshot_to_ack", "final_checkpoint"]
        if point in _AFTER_COMPLETION:
            options.append("restore")
        if point in _PER_BATCH:
            options.append(point)
        nxt = rng.choice(options)
        plan.append(PlannedFault(nxt, 0))
    return plan


def checkpoint_failure_plan(rng: random.Random, hits: dict[str, int]) -> list[PlannedFault]:
    """One or two tolerated checkpoint failures: a declined checkpoint or one that expires."""
    count = hits.get("snapshot_to_ack", 0)
    assert count > 0, f"no checkpoint was acknowledged: {hits}"
    after = rng.randint(0, max(0, min(count // 4, LINGER_CHECKPOINTS) - 1))
    plan = [PlannedFault("snapshot_to_ack", after, rng.choice(["decline", "stall"]))]
    if rng.random() < 0.4:
        plan.append(PlannedFault("snapshot_to_ack", 0, rng.choice(["decline", "stall"])))
    return plan


def injector_for(plan: list[PlannedFault], runtime: str, rng: random.Random) -> tuple[Any, int]:
    """The fault hook that arms ``plan`` on ``runtime`` and how many faults it arms.

    On Spark, slot 0 hosts subtask 0 of every vertex: early hits are armed (there are fewer than in the whole
    job; a final checkpoint is hit once per task), and a global commit runs on the driver, where slot crashes
    cannot reach: the crash comes before the commit instead.
    """
    if runtime == "spark":
        faults = SparkFaultInjector(
            SlotCrash(
                "complete_to_commit" if f.point in ("commit", "global_commit") else f.point,
                0 if f.point == "final_checkpoint" else min(f.after, 2),
                attempt=n,
                slot=0,
                how=rng.choice(["kill", "raise"]),
            )
            for n, f in enumerate(plan)
        )
        return faults, len(plan)
    injector = FaultInjector(plan=plan)
    return injector, injector.armed
