"""Run the fault-injection shapes (tests/faults/shapes.py) on the Spark runtime or in-process."""

from __future__ import annotations

import functools
import random
import tempfile
from typing import Any

from sluice import CheckpointConfig, FixedDelayRestart, Pipeline
from sluice.api import JobResult
from sluice.sinks.testing import read_committed
from sluice.testing.faults import FaultInjector

from tests.faults.shapes import SHAPES, Shape, rows_of


def shape_named(name: str) -> Shape:
    return next(s for s in SHAPES if s.name == name)


def run_shape_on(
    runtime: str,
    shape: Shape,
    seed: int,
    faults: FaultInjector | None = None,
    checkpoint: dict[str, Any] | None = None,
    attempts: int = 4,
) -> tuple[list[tuple[Any, ...]], JobResult]:
    """Build ``shape`` with ``seed`` (as tests/faults does), run it on ``runtime``; return committed rows."""
    rng = random.Random(seed)
    d = tempfile.mkdtemp(prefix=f"sluice-spark-{shape.name}-{seed}-")
    p = Pipeline(
        f"{shape.name}-{seed}",
        max_parallelism=rng.choice([8, 16, 128]),
        checkpoint=CheckpointConfig(
            interval=rng.choice([0.05, 0.1, 0.2]), storage=f"{d}/chk", **(checkpoint or {})
        ),
        restart=FixedDelayRestart(attempts=attempts, delay=0.0),
        buffers_per_channel=rng.choice([1, 2, 4]),
    )
    shape.build(p, rng, f"{d}/out")
    result = p.run(runtime=runtime, faults=faults, restore="none")
    return rows_of(read_committed(f"{d}/out")), result


@functools.cache
def reference(shape_name: str, seed: int) -> tuple[tuple[Any, ...], ...]:
    """The committed output of a failure-free in-process run."""
    rows, _ = run_shape_on("local", shape_named(shape_name), seed)
    return tuple(rows)


def num_slots(shape_name: str, seed: int) -> int:
    rng = random.Random(seed)
    p = Pipeline("probe", max_parallelism=rng.choice([8, 16, 128]))
    rng.choice([0.05, 0.1, 0.2]), rng.choice([1, 2, 4])
    shape_named(shape_name).build(p, rng, tempfile.mkdtemp(prefix="sluice-probe-"))
    return p.build().num_slots
