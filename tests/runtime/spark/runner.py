"""Run the fault-injection shapes (tests/faults/shapes.py) on the Spark runtime or in-process."""

from __future__ import annotations

import functools
from typing import Any

from sluice.api import JobResult
from sluice.runtime.fault_hook import FaultHook

from tests.faults.expected import expected_rows
from tests.faults.shapes import SHAPE, Shape, inputs_of, run_shape


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
    """What the shape must commit, computed from its input in plain Python (tests/faults/expected.py)."""
    return expected_rows(shape_name, inputs_of(shape_named(shape_name), seed))

