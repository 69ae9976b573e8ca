"""Run the fault-injection shapes (tests/faults/shapes.py) on the Spark runtime or in-process."""

from __future__ import annotations

import functools
from typing import Any

from sluice.api import JobResult
from sluice.runtime.fault_hook import FaultHook

from tests.faults.shapes import SHAPE, Shape, run_shape


def shape_named(name: str) -> Shape:
    return SHAPE[name]


def run_shape_on(
    runtime: str,
    shape: Shape,
    seed: int,
    faults: FaultHook | None = None,
    checkpoint: dict[str, Any] | None = None,
    attempts: int = 4,
) -> tuple[list[tuple[Any, ...]], JobResult]:
    """Build ``shape`` with ``seed`` (as tests/faults does), run it on ``runtime``; return committed rows."""
    run = run_shape(shape, seed, faults, attempts=attempts, runtime=runtime, checkpoint=checkpoint)
    if run.error is not None:
        raise run.error
    assert run.result is not None
    return run.rows, run.result


@functools.cache
def reference(shape_name: str, seed: int) -> tuple[tuple[Any, ...], ...]:
    """The committed output of a failure-free in-process run."""
    rows, _ = run_shape_on("local", shape_named(shape_name), seed)
    return tuple(rows)

