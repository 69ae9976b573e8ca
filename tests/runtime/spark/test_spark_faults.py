"""Exactly-once on the Spark runtime: a slot's Python worker is SIGKILLed (or raises) mid-stream and
mid-checkpoint; the committed output must equal a failure-free in-process run's."""

from __future__ import annotations

from typing import Any

import pytest
from sluice.testing.faults import FaultInjector
from sluice.testing.spark_faults import SlotCrash, SparkFaultInjector

from tests.faults.shapes import record
from tests.runtime.spark.runner import reference, run_shape_on, shape_named

pytestmark = [pytest.mark.spark, pytest.mark.faults]

K = SlotCrash
#: (id, shape, seed, crashes, checkpoint options); seeds picked for 1-3 slots
SCENARIOS: list[tuple[str, str, int, list[SlotCrash], dict[str, Any]]] = [
    ("chain-kill-source", "chain", 3, [K("source", 5)], {}),
    ("keyed-kill-source-slot1", "keyed", 2, [K("source", 2, slot=1)], {}),
    ("keyed-kill-process", "keyed", 7, [K("process", 10)], {}),
    ("union-kill-snapshot_to_ack", "union", 3, [K("snapshot_to_ack", 1)], {}),
    ("union-kill-align", "union", 8, [K("align", 0)], {}),
    ("keyed-kill-complete_to_commit", "keyed", 2, [K("complete_to_commit", 1)], {}),
    ("union-raise-process", "union", 7, [K("process", 8, how="raise")], {}),
    (
        "two_keyed-kill-twice",
        "two_keyed",
        8,
        [K("process", 15, slot=1), K("snapshot_to_ack", 1, attempt=1)],
        {},
    ),
    (
        "keyed-kill-ack-then-kill-restore",
        "keyed",
        2,
        [K("snapshot_to_ack", 6), K("restore", 0, attempt=1, slot=1)],
        {},
    ),
    ("keyed-unaligned-kill-process", "keyed", 8, [K("process", 12, slot=1)], {"unaligned": True}),
    (
        "keyed-adaptive-kill-snapshot_to_ack",
        "keyed",
        7,
        [K("snapshot_to_ack", 1)],
        {"aligned_checkpoint_timeout": 0.005},
    ),
]


@pytest.mark.parametrize(
    ("shape", "seed", "crashes", "checkpoint"), [s[1:] for s in SCENARIOS], ids=[s[0] for s in SCENARIOS]
)
def test_slot_crash_keeps_exactly_once(
    spark: Any, shape: str, seed: int, crashes: list[SlotCrash], checkpoint: dict[str, Any]
) -> None:
    expected = reference(shape, seed)
    assert expected, "the failure-free run committed nothing"
    faults = SparkFaultInjector(crashes)
    got, result = run_shape_on("spark", shape_named(shape), seed, faults, checkpoint)
    fired = len(faults.fired) == len(crashes)
    record("spark-slot", f"{shape}-{seed}", shape, "aligned", fired, len(faults.fired), got, expected)
    assert len(faults.fired) == len(crashes), (
        f"not every crash fired: {faults.fired} (failures {result.failures})"
    )
    assert result.attempts == len(crashes) + 1, result.failures
    assert len(got) == len(expected), f"{len(got)} rows committed, expected {len(expected)}; {faults.fired}"
    assert got == list(expected), f"committed output differs; crashes {faults.fired}"


def test_plain_fault_injector_raises_in_slots(spark: Any) -> None:
    """A plain FaultInjector (as tests/faults uses) maps to one raising crash per attempt in slot 0."""
    expected = reference("rebalance", 7)
    faults = FaultInjector(point="process", after=2)
    got, result = run_shape_on("spark", shape_named("rebalance"), 7, faults)
    assert len(faults.fired) == 1 and result.attempts == 2, result.failures
    assert "InjectedFault" in result.failures[0]
    assert got == list(expected)
