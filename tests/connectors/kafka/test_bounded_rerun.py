"""Bounds given to a run apply to the splits it restores (issue 21, point 4).

A job run without stopping offsets and stopped, then run again with them (restore="latest", the default),
used to keep the first run's unbounded stop in its restored splits and never end. Each run here restores
the previous run's latest checkpoint; the committed output must equal the input, nothing more. On Apache
Kafka: ``"latest"`` is the broker's answer there (tansu under-reported it, tests/broker_quirks).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sluice.api import JobClient
from sluice.connectors.kafka import KafkaSource
from sluice.sinks.testing import TwoPhaseCommitTestSink, read_committed

from tests.apache_kafka import ApacheKafkaBroker
from tests.connectors.kafka.helpers import committed_ids, produce_json
from tests.connectors.kafka.test_kafka_e2e import SCHEMA, pipeline, wait_for
from tests.faults.shapes import record
from tests.kafka_test_broker import KafkaTestBroker

pytestmark = [pytest.mark.kafka, pytest.mark.usefixtures("kafka_reader")]  # on both readers


def _start(
    broker: KafkaTestBroker, t: str, out: Path, tmp_path: Path, runtime: str = "local", **options: Any
) -> JobClient:
    p = pipeline("rerun", tmp_path)
    p.source(KafkaSource(broker.bootstrap, t, format="json", schema=SCHEMA, **options)).sink(
        TwoPhaseCommitTestSink(str(out))
    )
    return p.start(runtime=runtime, restore="latest")  # type: ignore[arg-type]


def _finishes(client: JobClient, limit_s: float = 90.0) -> None:
    """The bounded run ends by itself (a generous safety limit, then it is cancelled and the test fails)."""
    try:
        wait_for(lambda: not client.running, limit_s=limit_s)
    except AssertionError:
        client.cancel()
        raise AssertionError("the bounded run did not end: its restored splits kept another bound") from None
    assert client.wait().status == "finished"


def _record(scenario: str, out: Path, ids: list[int]) -> None:
    """Count the rerun in the fault summary (tests/conftest.py): the restore from another run's checkpoint."""
    record("bounded-rerun", scenario, "kafka->test-sink", "rerun", True, 0, committed_ids(read_committed(str(out))), ids)


def _unbounded_until(client: JobClient, out: Path, ids: list[int]) -> None:
    try:
        wait_for(lambda: committed_ids(read_committed(str(out))) == sorted(ids), client, limit_s=120)
    finally:
        client.cancel()


def test_bounded_rerun_after_an_unbounded_run_ends_with_the_input(
    apache_kafka: ApacheKafkaBroker, kafka_topic: Callable[..., str], tmp_path: Path, runtime: str
) -> None:
    broker, t = apache_kafka, kafka_topic(2)
    out = tmp_path / "out"
    ids = produce_json(broker, t, {0: range(0, 300), 1: range(1000, 1200)})
    _unbounded_until(_start(broker, t, out, tmp_path, runtime), out, ids)
    ids += produce_json(broker, t, {0: range(300, 305), 1: range(1200, 1203)})
    _finishes(_start(broker, t, out, tmp_path, runtime, stopping_offsets="latest"))
    _record(f"unbounded-then-latest-{runtime}", out, ids)
    assert committed_ids(read_committed(str(out))) == sorted(ids)


def test_bounded_rerun_with_an_explicit_stop_map_reads_up_to_it(
    apache_kafka: ApacheKafkaBroker, kafka_topic: Callable[..., str], tmp_path: Path
) -> None:
    broker, t = apache_kafka, kafka_topic(2)
    out = tmp_path / "out"
    ids = produce_json(broker, t, {0: range(0, 200), 1: range(1000, 1100)})
    _unbounded_until(_start(broker, t, out, tmp_path), out, ids)
    ids += produce_json(broker, t, {0: range(200, 250), 1: range(1100, 1120)})
    ends = {(t, p): end for p, end in broker.end_offsets(t).items()}
    ids += produce_json(broker, t, {0: range(250, 260)})  # after the stop map: not read
    _finishes(_start(broker, t, out, tmp_path, stopping_offsets=ends))
    ids = [i for i in ids if not 250 <= i < 260]
    _record("unbounded-then-stop-map", out, ids)
    assert committed_ids(read_committed(str(out))) == sorted(ids)


def test_bounded_run_then_another_bounded_run_reads_what_came_since(
    apache_kafka: ApacheKafkaBroker, kafka_topic: Callable[..., str], tmp_path: Path
) -> None:
    broker, t = apache_kafka, kafka_topic(2)
    out = tmp_path / "out"
    ids = produce_json(broker, t, {0: range(0, 100), 1: range(1000, 1050)})
    _finishes(_start(broker, t, out, tmp_path, stopping_offsets="latest"))
    ids += produce_json(broker, t, {0: range(100, 130), 1: range(1050, 1060)})
    _finishes(_start(broker, t, out, tmp_path, stopping_offsets="latest"))
    _record("bounded-then-bounded", out, ids)
    assert committed_ids(read_committed(str(out))) == sorted(ids)


def test_unbounded_rerun_after_a_bounded_run_reads_on(
    apache_kafka: ApacheKafkaBroker, kafka_topic: Callable[..., str], tmp_path: Path
) -> None:
    """The reverse: the bounded run's stop offsets are not kept by an unbounded run that restores them."""
    broker, t = apache_kafka, kafka_topic(2)
    out = tmp_path / "out"
    ids = produce_json(broker, t, {0: range(0, 100), 1: range(1000, 1050)})
    _finishes(_start(broker, t, out, tmp_path, stopping_offsets="latest"))
    ids += produce_json(broker, t, {0: range(100, 160), 1: range(1050, 1070)})
    _unbounded_until(_start(broker, t, out, tmp_path), out, ids)
    _record("bounded-then-unbounded", out, ids)
    assert committed_ids(read_committed(str(out))) == sorted(ids)


# -- the run's bounds, unit-tested against a fake broker lookup -----------------------------------------
class _Lookup:
    """OffsetLookup whose high watermark the test moves (records produced while the job runs)."""

    def __init__(self, high: int) -> None:
        self.high = high

    def watermarks(self, tps: list[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
        return {tp: (0, self.high) for tp in tps}

    def committed(self, tps: list[tuple[str, int]]) -> dict[tuple[str, int], int | None]:
        return dict.fromkeys(tps)

    def for_times(self, tps: list[tuple[str, int]], timestamp_ms: int) -> dict[tuple[str, int], int | None]:
        return dict.fromkeys(tps)


class _Ctx:
    def __init__(self, attempt: int) -> None:
        self.attempt = attempt
        self.parallelism = 1

    def assign_splits(self, assignment: dict[int, list[Any]]) -> None:
        pass

    def signal_no_more_splits(self, subtask: int) -> None:
        pass

    def registered_readers(self) -> list[int]:
        return []


def _ends(source: KafkaSource, attempt: int, lookup: _Lookup, end: int | None) -> int | None:
    from sluice.connectors.kafka.offsets import KafkaSplit

    enum: Any = source.create_enumerator(_Ctx(attempt), None)  # type: ignore[arg-type]
    enum._lookup = lookup
    (split,) = enum._bounded([KafkaSplit("t:0", 40, end)])
    return split.end  # type: ignore[no-any-return]


def test_a_failover_keeps_the_runs_latest_stop_and_a_new_run_resolves_it_again() -> None:
    src = KafkaSource("localhost:9092", "t", stopping_offsets="latest")
    lookup = _Lookup(100)
    assert _ends(src, 0, lookup, None) == 100  # the run starts: "latest" now
    lookup.high = 150  # records produced while the run goes on
    assert _ends(src, 1, lookup, 100) == 100  # a restart within the run keeps its bound
    assert _ends(src, 2, lookup, None) == 100  # even from a checkpoint of an earlier run
    assert _ends(src, 0, lookup, 100) == 150  # the next run resolves its own


def test_an_unbounded_run_drops_restored_stop_offsets() -> None:
    assert _ends(KafkaSource("localhost:9092", "t"), 0, _Lookup(100), 60) is None
