"""A crash on the Spark runtime, then a restore of its retained checkpoint on Spark at another parallelism.

The first run (every parallelism ``first``) crashes at a random reachable point (its ``plan``, armed in
attempt 0), restarts once at that parallelism and crashes again between the completion of its restored
attempt's first checkpoint and its commit: restarts are spent, the job fails and leaves a completed checkpoint
whose commit is pending (every attempt completes ``LINGER_CHECKPOINTS`` checkpoints before its input ends, so
that checkpoint always exists). A second run on Spark at parallelism ``second`` resumes it: keyed state,
timers and buffers are split by key group over the new subtasks, the pending committables are committed by
the subtasks that exist now.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.testing.faults import PlannedFault

from tests.faults.plans import injector_for
from tests.faults.shapes import Run, Shape, run_shape

#: (first, second) parallelism: up and down
SCALES = ((1, 3), (3, 1), (2, 4), (4, 2))


@dataclass
class SparkRescale:
    """What a crash-then-rescale scenario left: both runs, the faults that fired and how many were armed."""

    first: Run
    second: Run
    fired: list[str]
    armed: int
    scales: tuple[int, int]

    @property
    def all_fired(self) -> bool:
        return len(self.fired) == self.armed


def crash_then_rescale_on_spark(
    shape: Shape,
    seed: int,
    plan: list[PlannedFault],
    tmp: Path,
    rng: random.Random,
    *,
    scales: tuple[int, int],
    alignment: dict[str, Any] | None = None,
    backend: str = "hashmap",
) -> SparkRescale:
    """Run ``shape`` on Spark at ``scales[0]`` with ``plan`` (one crash) then a crash after a completed
    checkpoint, and restore it on Spark at ``scales[1]`` (the caller asks for the ``spark`` fixture)."""
    assert len(plan) == 1, "the first crash only: the second one ends the run after a completed checkpoint"
    faults, armed = injector_for([*plan, PlannedFault("complete_to_commit", 0)], "spark", rng)
    kw: dict[str, Any] = {"directory": str(tmp), "backend": backend, "alignment": alignment}
    kw["runtime"] = "spark"
    first = run_shape(shape, seed, faults, attempts=1, scale=scales[0], **kw)
    fired = list(faults.fired)
    second = run_shape(shape, seed, None, attempts=4, scale=scales[1], restore="latest", **kw)
    return SparkRescale(first, second, fired, armed, scales)
