"""Exactly-once into Kafka and PostgreSQL under crashes at every lifecycle point, a restore at another
parallelism, and on the Spark runtime (slots killed with SIGKILL): the committed output (what a plain
``read_committed`` consumer of the topic on Apache Kafka reads, the table's rows) equals the output expected
from the shape's input, computed in plain Python (tests/faults/expected.py), as multisets; each failure-free
run into a sink is checked against it too.

Crash points: while processing, between a pre-commit and its acknowledgement, between a checkpoint's
completion and its commit, in the middle of a commit (Kafka: records sent, transaction open; PostgreSQL:
right after a ``COMMIT PREPARED``, before an upsert's merge), at the final checkpoint; PostgreSQL also in the
middle of a pre-commit (rows written, transaction not prepared); Kafka also while restoring after a crash in
a commit. A scenario is logged in the fault summary only when its fault fired. The Kafka scenarios run on
Apache Kafka (a JVM broker started once per session by the ``apache_kafka`` fixture): the default run has one
crash per lifecycle point, one rescale and one Spark slot killed; ``-m soak`` the rest. The Kafka sink's
kills inside a large publish and its fencing are in tests/faults/test_kafka_sink_kills.py and
tests/sinks/kafka/test_transactions.py.
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
from tests.faults.shapes import LINGER_CHECKPOINTS, SHAPE, record, run_shape
from tests.faults.test_exactly_once import alignment, check_exactly_once, reference, scenario
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
#: (sink, scenario) of the default run: every point of each sink at least once (Kafka: once, on Apache Kafka)
FAST_CASES = [("kafka", i) for i in range(len(POINTS["kafka"]))] + [("postgres", i) for i in range(10)] + [
    ("postgres_upsert", i) for i in range(6)
]
SOAK = 150
#: Kafka scenarios of the soak run besides ``SOAK``'s: the default run's points a second time
KAFKA_SOAK = range(len(POINTS["kafka"]), 10)


def _case(sink: str, *rest: Any, soak: bool = False) -> Any:
    """A parameter set; the Kafka ones carry the ``apache_kafka`` marker (their broker is fetched lazily)."""
    marks = [pytest.mark.apache_kafka] if sink == "kafka" else []
    return pytest.param(sink, *rest, marks=marks + ([pytest.mark.soak] if soak else []))


@pytest.fixture(scope="module", autouse=True)
def _external(postgres: PostgresServer) -> Iterator[None]:
    use_postgres(postgres, postgres.new_database())
    yield


@pytest.fixture(autouse=True)
def _kafka(request: pytest.FixtureRequest) -> None:
    """The Kafka cases' sink writes to the session's Apache Kafka (started by the first test that needs it)."""
    if getattr(request.node, "callspec", None) is not None and request.node.callspec.params.get("sink") == "kafka":
        use_kafka(request.getfixturevalue("apache_kafka"))


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
    if point in ("process", "source"):  # hit once per batch: the count barely depends on timing
        after = rng.randint(0, max(0, count // 2 - 1))
    elif point in ("commit", "final_checkpoint"):  # a commit with data, the final checkpoint: certain once
        after = 0
    else:  # hit per checkpoint: certain LINGER_CHECKPOINTS times in every run, however fast or slow
        after = rng.randint(0, max(0, min(count // 4, LINGER_CHECKPOINTS) - 1))
    faults = FaultInjector(plan=[PlannedFault(point, after)])
    run = run_shape(SHAPE[shape], seed, faults, alignment=alignment(mode, rng), sink=sink, directory=str(tmp))
    label = f"{shape} {mode} into {sink} seed={seed} fired={faults.fired}"
    if faults.all_fired:
        record(f"sink-{sink}", i, shape, mode, True, faults.crashes, run.rows, expected)
    assert run.error is None and run.result is not None, f"{label}: {run.error}"
    assert faults.all_fired, f"{label}: armed faults did not fire"
    check_exactly_once(label, run.rows, expected)


_CRASH_CASES = [_case(s, i) for s, i in FAST_CASES] + [_case("kafka", i, soak=True) for i in KAFKA_SOAK]


@pytest.mark.parametrize(("sink", "i"), _CRASH_CASES, ids=[f"{c.values[0]}-{c.values[1]}" for c in _CRASH_CASES])
def test_crash(sink: str, i: int, tmp_path: Path) -> None:
    crash_scenario(sink, i, tmp_path)


@pytest.mark.soak
@pytest.mark.parametrize("sink", [_case("kafka"), "postgres", "postgres_upsert"])
@pytest.mark.parametrize("i", range(10, 10 + SOAK))
def test_soak_crash(sink: str, i: int, tmp_path: Path) -> None:
    crash_scenario(sink, i, tmp_path)


def kafka_restore_scenario(i: int, tmp: Path) -> None:
    """A crash in the middle of a commit (records sent, transaction open), then another while the restarted
    attempt restores: the second restore aborts both attempts' leftovers and publishes each checkpoint once."""
    shape, seed, mode, rng = scenario(i)
    expected = reference(shape, seed)
    hits = sink_hits(shape, seed, "kafka")
    assert hits.get("commit", 0) > 0, f"{shape} into kafka: no commit reached ({hits})"
    faults = FaultInjector(plan=[PlannedFault("commit", 0), PlannedFault("restore", 0)])
    run = run_shape(SHAPE[shape], seed, faults, alignment=alignment(mode, rng), sink="kafka", directory=str(tmp))
    label = f"{shape} {mode} into kafka seed={seed} fired={faults.fired}"
    if faults.all_fired:
        record("sink-kafka-restore", i, shape, mode, True, faults.crashes, run.rows, expected)
    assert run.error is None and run.result is not None, f"{label}: {run.error}"
    assert faults.all_fired, f"{label}: armed faults did not fire"
    check_exactly_once(label, run.rows, expected)


@pytest.mark.parametrize("i", [pytest.param(i, marks=[pytest.mark.soak] if i else []) for i in range(6)])
def test_kafka_crash_in_commit_then_in_restore(i: int, apache_kafka: Any, tmp_path: Path) -> None:
    use_kafka(apache_kafka)
    kafka_restore_scenario(i, tmp_path)


_RESCALE_CASES = [_case(s, i, soak=(s, i) == ("kafka", 1)) for s in ("kafka", "postgres", "postgres_upsert") for i in range(2)]


@pytest.mark.parametrize(("sink", "i"), _RESCALE_CASES, ids=[f"{c.values[0]}-{c.values[1]}" for c in _RESCALE_CASES])
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
_SPARK_CASES = [pytest.param(*_case(*c).values, id=f"{c[0]}-{c[1]}", marks=_case(*c).marks) for c in SPARK] + [
    pytest.param(*_case(*c).values, id=f"{c[0]}-{c[1]}", marks=_case(*c, soak=True).marks) for c in SPARK_SOAK
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
        _case("kafka", soak=True),
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
