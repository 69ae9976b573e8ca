"""Exactly-once into Kafka and PostgreSQL under crashes at every lifecycle point, a restore at another
parallelism, and on the Spark runtime (slots killed with SIGKILL): the committed output (the topic read per
tests/sinks/kafka/reader.py, the table's rows) equals the output expected from the shape's input, computed in
plain Python (tests/faults/expected.py); each failure-free run into a sink is checked against it too.

Crash points: while processing, between a pre-commit and its acknowledgement, between a checkpoint's
completion and its commit, in the middle of a commit (Kafka: records sent, transaction open; PostgreSQL:
right after a ``COMMIT PREPARED``, before an upsert's merge), at the final checkpoint; PostgreSQL also in the
middle of a pre-commit (rows written, transaction not prepared). A scenario is logged in the fault summary only when its fault fired.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sluice.testing.faults import FaultInjector, HitCounter, PlannedFault
from sluice.testing.spark_faults import SlotCrash, SparkFaultInjector

from tests.faults.external import use_kafka, use_postgres
from tests.faults.shapes import SHAPE, record, run_shape
from tests.faults.test_exactly_once import alignment, check_exactly_once, reference, scenario
from tests.kafka_broker import TansuBroker
from tests.postgres_server import PostgresServer

pytestmark = pytest.mark.faults

POINTS = {
    "kafka": ("process", "snapshot_to_ack", "complete_to_commit", "commit", "final_checkpoint"),
    "postgres": (
        "process",
        "snapshot_to_ack",
        "complete_to_commit",
        "commit",
        "pre_commit",
        "final_checkpoint",
    ),
}
POINTS["postgres_upsert"] = POINTS["postgres"]
#: (sink, scenario) of the default run: every point of each sink at least once
FAST_CASES = [(s, i) for s in ("kafka", "postgres") for i in range(10)] + [
    ("postgres_upsert", i) for i in range(6)
]
SOAK = 150


@pytest.fixture(scope="module", autouse=True)
def _external(broker: TansuBroker, postgres: PostgresServer) -> Iterator[None]:
    use_kafka(broker)
    use_postgres(postgres, postgres.new_database())
    yield


@functools.cache
def sink_hits(shape: str, seed: int, sink: str) -> dict[str, int]:
    """Hits per fault point of a failure-free run into ``sink`` (whose rows must equal the reference)."""
    import tempfile

    counter = HitCounter()
    with tempfile.TemporaryDirectory(prefix=f"sluice-hits-{sink}-") as d:
        run = run_shape(SHAPE[shape], seed, counter, sink=sink, directory=d)
    assert run.error is None, run.error
    check_exactly_once(f"{shape} into {sink} seed={seed}, failure-free", list(run.rows), reference(shape, seed))
    return dict(counter.hits)


def crash_scenario(sink: str, i: int, tmp: Path) -> None:
    shape, seed, mode, rng = scenario(i)
    expected = reference(shape, seed)
    hits = sink_hits(shape, seed, sink)
    # a chain runs in one task: its operators are reached at "source"
    points = [p if p != "process" or hits.get(p) else "source" for p in POINTS[sink]]
    point = points[i % len(points)]
    count = hits.get(point, 0)
    assert count > 0, f"{shape} into {sink}: {point} was never reached ({hits})"
    after = 0 if point == "final_checkpoint" else rng.randint(0, max(0, count // 2 - 1))
    faults = FaultInjector(plan=[PlannedFault(point, after)])
    run = run_shape(SHAPE[shape], seed, faults, alignment=alignment(mode, rng), sink=sink, directory=str(tmp))
    label = f"{shape} {mode} into {sink} seed={seed} fired={faults.fired}"
    if faults.all_fired:
        record(f"sink-{sink}", i, shape, mode, True, faults.crashes, run.rows, expected)
    assert run.error is None and run.result is not None, f"{label}: {run.error}"
    assert faults.all_fired, f"{label}: armed faults did not fire"
    check_exactly_once(label, run.rows, expected)


@pytest.mark.parametrize(("sink", "i"), FAST_CASES, ids=[f"{s}-{i}" for s, i in FAST_CASES])
def test_crash(sink: str, i: int, tmp_path: Path) -> None:
    crash_scenario(sink, i, tmp_path)


@pytest.mark.soak
@pytest.mark.parametrize("sink", ["kafka", "postgres", "postgres_upsert"])
@pytest.mark.parametrize("i", range(10, 10 + SOAK))
def test_soak_crash(sink: str, i: int, tmp_path: Path) -> None:
    crash_scenario(sink, i, tmp_path)


@pytest.mark.parametrize("sink", ["kafka", "postgres", "postgres_upsert"])
@pytest.mark.parametrize("i", range(2))
def test_crash_then_restore_at_another_parallelism(sink: str, i: int, tmp_path: Path) -> None:
    """A crash ends the first run (no restart) after a checkpoint completed and before its commit; a second
    run restores it at another parallelism: committables of writer subtasks that no longer exist are
    committed by the ones that do."""
    shape, seed, _, rng = scenario(2 * i + 2)  # shapes with exchanges
    expected = reference(shape, seed)
    faults = FaultInjector(point="complete_to_commit", after=0)
    first = run_shape(SHAPE[shape], seed, faults, attempts=0, directory=str(tmp_path), scale=rng.choice([3, 4]),
                      sink=sink)  # fmt: skip
    assert first.error is not None and faults.all_fired, (
        f"{shape}: the first run did not crash ({faults.fired})"
    )
    second = run_shape(SHAPE[shape], seed, None, directory=str(tmp_path), scale=rng.choice([1, 2]),
                       restore="latest", sink=sink)  # fmt: skip
    label = f"{shape} into {sink} seed={seed} fired={faults.fired}"
    assert second.error is None, f"{label}: {second.error}"
    record(f"sink-{sink}-rescale", i, shape, "aligned", True, 1, second.rows, expected)
    check_exactly_once(label, second.rows, expected)


#: a Spark run takes about 30 s here: the default run kills a slot at one point per sink and mode, the soak
#: run at the others
SPARK = [("kafka", "complete_to_commit", 0), ("postgres_upsert", "commit", 1)]
SPARK_SOAK = [("kafka", "commit", 0), ("postgres", "snapshot_to_ack", 1), ("kafka", "process", 3),
              ("postgres", "complete_to_commit", 0), ("postgres", "commit", 0),
              ("postgres_upsert", "pre_commit", 0)]  # fmt: skip
_SPARK_CASES = [pytest.param(*c, id=f"{c[0]}-{c[1]}") for c in SPARK] + [
    pytest.param(*c, id=f"{c[0]}-{c[1]}", marks=pytest.mark.soak) for c in SPARK_SOAK
]


@pytest.mark.spark
@pytest.mark.parametrize(("sink", "point", "after"), _SPARK_CASES)
def test_spark_slot_killed(sink: str, point: str, after: int, spark: Any, tmp_path: Path) -> None:
    """A slot's Python worker is killed with SIGKILL (its producers, connections and open transactions die
    with it); the restored attempt aborts or commits what it left, exactly once."""
    shape, seed = "keyed", 2
    expected = reference(shape, seed)
    faults = SparkFaultInjector([SlotCrash(point, after, attempt=0, slot=0, how="kill")])
    run = run_shape(
        SHAPE[shape], seed, faults, runtime="spark", sink=sink, directory=str(tmp_path), attempts=4
    )
    fired = len(faults.fired) == 1
    if fired:
        record(f"sink-{sink}-spark", point, shape, "aligned", True, 1, run.rows, expected)
    assert run.error is None, run.error
    assert fired, f"the crash did not fire: {faults.fired}"
    check_exactly_once(f"{shape} into {sink} on Spark, {point}", run.rows, expected)


@pytest.mark.spark
@pytest.mark.parametrize(
    "sink",
    [
        "postgres",
        pytest.param("kafka", marks=pytest.mark.soak),
        pytest.param("postgres_upsert", marks=pytest.mark.soak),
    ],
)
def test_crash_then_restore_on_spark_at_another_parallelism(sink: str, spark: Any, tmp_path: Path) -> None:
    """As above, the restore on the Spark runtime: its slots commit what writer subtasks of the crashed run
    (a parallelism that no longer exists) pre-committed."""
    shape, seed, _, _ = scenario(2)
    expected = reference(shape, seed)
    faults = FaultInjector(point="complete_to_commit", after=0)
    first = run_shape(SHAPE[shape], seed, faults, attempts=0, directory=str(tmp_path), scale=3, sink=sink)
    assert first.error is not None and faults.all_fired, (
        f"{shape}: the first run did not crash ({faults.fired})"
    )
    second = run_shape(SHAPE[shape], seed, None, runtime="spark", directory=str(tmp_path), scale=2,
                       restore="latest", sink=sink, attempts=4)  # fmt: skip
    label = f"{shape} into {sink} seed={seed}, restored on Spark"
    assert second.error is None, f"{label}: {second.error}"
    record(f"sink-{sink}-rescale-spark", 0, shape, "aligned", True, 1, second.rows, expected)
    check_exactly_once(label, second.rows, expected)
