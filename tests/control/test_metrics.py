"""Metrics in both runtimes: exact record counts, time shares, restarts, the Prometheus names, Kafka lag,
and Spark slots reporting to the driver over their control connection while the job runs."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from prometheus_client import generate_latest
from sluice import CheckpointConfig, FixedDelayRestart, Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.connectors.kafka import KafkaSource
from sluice.control.metrics import METRICS, job_registry
from sluice.control.progress import summary_line
from sluice.sinks.testing import TwoPhaseCommitTestSink
from sluice.testing import FaultInjector

from tests.apache_kafka import ApacheKafkaBroker
from tests.connectors.kafka.helpers import produce_json
from tests.control.conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]
N = 2 * 3000


def slow(batch: pa.RecordBatch) -> pa.RecordBatch:
    time.sleep(0.001)
    return batch


def bounded(tmp_path: Path, name: str, **kw: Any) -> Pipeline:
    p = Pipeline(name, parallelism=2, checkpoint=CheckpointConfig(interval=0.05, storage=str(tmp_path / "chk")),
                 restart=FixedDelayRestart(attempts=3, delay=0), **kw)
    src = GeneratorSource(num_splits=2, records_per_split=N // 2, batch_size=50)
    p.source(src).rebalance().map_batches(slow, name="enrich").sink(TwoPhaseCommitTestSink(str(tmp_path / "out")))
    return p


def test_counts_are_exact_and_time_adds_up(tmp_path: Path) -> None:
    client = bounded(tmp_path, "counted").start(runtime="local", restore="none", control_endpoint=None)
    result = client.wait(120)
    vm = result.vertex_metrics
    src, sink = vm["generator"], vm["rebalance -> enrich -> test-sink"]
    assert src["records_in"] == src["records_out"] == sink["records_in"] == N
    assert src["batches_in"] == N // 50 and sink["records_out"] == 0
    assert src["bytes_in"] > 0 and src["bytes_out"] == sink["bytes_in"]
    for v in (src, sink):
        parts = v["busy_s"] + v["idle_s"] + v["backpressured_s"]
        assert parts == pytest.approx(v["elapsed_s"], rel=1e-6)
    assert sink["counters"]["commits"] >= 1 and "commit_time_us" in sink["counters"]
    assert sink["counters"]["sink_records"] == N and "sink_records" not in src["counters"]
    text = generate_latest(job_registry(client.monitor)).decode()
    assert f'sluice_task_records_in_total{{job="counted",subtask="0",vertex="generator"}} {N // 2}.0' in text
    assert re.search(r'sluice_commit_time_seconds_total\{job="counted",subtask="\d",vertex="rebalance', text)
    assert 'sluice_job_status{job="counted",status="finished"} 1.0' in text
    assert 'sluice_checkpoints_total{job="counted",status="completed"}' in text


def test_totals_survive_a_restart(tmp_path: Path) -> None:
    faults = FaultInjector(point="process", after=40)
    client = bounded(tmp_path, "restarted").start(runtime="local", restore="none", faults=faults, control_endpoint=None)
    result = client.wait(120)
    assert faults.fired and result.attempts == 2
    sink = result.vertex_metrics["rebalance -> enrich -> test-sink"]
    assert sink["records_in"] >= N  # replayed records count again: they were processed again
    o = client.monitor.overview()
    assert o["restarts"] == 1 and len(o["failures"]) == 1 and "InjectedFault" in o["failures"][0]["error"]
    totals = client.monitor.vertex_totals()
    assert totals[1]["records_in"] == sink["records_in"]  # the monitor folded the failed attempt in
    assert 'sluice_job_restarts_total{job="restarted"} 1.0' in generate_latest(job_registry(client.monitor)).decode()


def test_without_metrics_nothing_is_counted(tmp_path: Path) -> None:
    result = bounded(tmp_path, "uncounted", metrics=False).run(runtime="local", restore="none", control_endpoint=None)
    assert result.status == "finished" and result.vertex_metrics == {}


def test_every_metric_is_documented() -> None:
    doc = (ROOT / "docs" / "operations.md").read_text()
    missing = [name for name, *_ in METRICS if name not in doc]
    assert not missing, f"docs/operations.md does not name {missing}"
    for name in ("sluice_kafka_lag_records", "sluice_kafka_fetched_records_total", "sluice_commit_time_seconds_total"):
        assert name in doc


@pytest.mark.kafka
def test_kafka_lag_and_fetch_counters(apache_kafka: ApacheKafkaBroker, kafka_topic: Callable[..., str], tmp_path: Path) -> None:
    # on Apache Kafka: the lag comes from the broker's last stable offsets (tansu under-reports its end);
    # that it reaches 0, also on transactional input: tests/connectors/kafka/test_apache_kafka_source.py
    broker, t = apache_kafka, kafka_topic(2)
    produce_json(broker, t, {0: range(0, 2000), 1: range(2000, 4000)})
    schema = pa.schema([("id", pa.int64()), ("p", pa.int64()), ("ts", pa.int64())])

    def crawl(batch: pa.RecordBatch) -> pa.RecordBatch:
        time.sleep(0.02)  # the reader falls behind what was produced: there is lag
        return batch

    p = Pipeline("lagging", parallelism=1, checkpoint=CheckpointConfig(interval=0.2, storage=str(tmp_path / "chk")))
    p.source(KafkaSource(broker.bootstrap, t, format="json", schema=schema, batch_size=50)).map_batches(crawl).sink(
        TwoPhaseCommitTestSink(str(tmp_path / "out"))
    )
    client = p.start(runtime="local", restore="none")
    try:
        def source_gauges() -> dict[str, float]:
            return client.monitor.vertex_totals()[0]["gauges"]  # type: ignore[no-any-return]

        lag = wait_for("a lag gauge above zero", lambda: source_gauges().get("kafka_lag_records", 0) > 0 and source_gauges())
        assert 0 < lag["kafka_lag_records"] <= 4000
        counters = client.monitor.vertex_totals()[0]["counters"]
        assert counters["kafka_fetched_records"] > 0 and counters["kafka_fetched_bytes"] > 0
        text = generate_latest(job_registry(client.monitor)).decode()
        assert 'sluice_kafka_lag_records{job="lagging",subtask="0",vertex="kafka -> map_batches -> test-sink"}' in text
        assert "sluice_kafka_fetched_records_total" in text
        line = summary_line(client.monitor)  # one source: its lag, labelled once (was "kafka lag kafka N")
        assert re.search(r"\| kafka lag [\d.]+k? records \|", line) and "lag kafka" not in line, line
    finally:
        client.cancel()


@pytest.mark.spark
def test_spark_slots_report_metrics_to_the_driver(spark: Any, tmp_path: Path) -> None:
    p = Pipeline("spark-metrics", parallelism=2, checkpoint=CheckpointConfig(interval=0.2, storage=str(tmp_path / "chk")))
    src = GeneratorSource(num_splits=2, records_per_split=8000, batch_size=50, rows_per_second=1500)
    p.source(src).rebalance().map_batches(slow, name="enrich").sink(TwoPhaseCommitTestSink(str(tmp_path / "out")))
    client = p.start(runtime="spark", restore="none")
    # while the stage runs, the driver sees what the slots report every second
    def reported() -> set[tuple[int, int]]:
        return {(s.vertex, s.index) for s, snap in client.monitor.subtask_totals().items() if snap["records_in"] > 0}

    every = {(0, 0), (0, 1), (1, 0), (1, 1)}
    wait_for("every slot's report", lambda: client.running and reported() == every, alive=lambda: client.running)
    assert client.monitor.runtime == "spark"
    text = generate_latest(job_registry(client.monitor)).decode()
    assert re.search(r'sluice_task_busy_seconds_total\{job="spark-metrics",subtask="1",vertex="generator"\} [1-9e.0-9]+', text)
    result = client.wait(300)
    assert result.status == "finished"
    vm = result.vertex_metrics
    assert vm["generator"]["records_out"] == vm["rebalance -> enrich -> test-sink"]["records_in"] == 16000
    assert vm["rebalance -> enrich -> test-sink"]["counters"]["commits"] >= 1
    assert vm["rebalance -> enrich -> test-sink"]["counters"]["sink_records"] == 16000  # reported by the slots
