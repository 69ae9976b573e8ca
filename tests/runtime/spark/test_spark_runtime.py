"""The Spark runtime end to end: refusals, logs, TLS, and a driver restart that resumes from storage."""

from __future__ import annotations

import logging
import tempfile
import time
from typing import Any

import pyarrow as pa
import pytest
from sluice import CheckpointConfig, FixedDelayRestart, Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.errors import ConfigError
from sluice.sinks.testing import TwoPhaseCommitTestSink, read_committed

from tests.faults.shapes import RunningCount, rows_of, with_key
from tests.runtime.spark.certs import self_signed
from tests.runtime.spark.runner import reference, run_shape_on, shape_named

pytestmark = pytest.mark.spark


def _tiny(name: str, parallelism: int, d: str) -> Pipeline:
    p = Pipeline(
        name,
        checkpoint=CheckpointConfig(interval=0.1, storage=f"{d}/chk"),
        restart=FixedDelayRestart(attempts=0, delay=0.0),
    )
    p.source(GeneratorSource(num_splits=2, records_per_split=50), parallelism=parallelism).sink(
        TwoPhaseCommitTestSink(f"{d}/out")
    )
    return p


def test_too_few_slots_is_refused(spark: Any) -> None:
    d = tempfile.mkdtemp()
    # refused at once: a restart cannot add slots
    with pytest.raises(ConfigError, match=r"needs 5 Spark task slot\(s\).*offers at most 4 \(spark.master=local\[4,1\]"):
        _tiny("too-wide", 5, d).run(runtime="spark", restore="none")


def test_the_driver_waits_for_slots_the_cluster_does_not_offer_yet(
    spark: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # as on a cluster whose executors register after the application started: the driver waits
    from sluice.runtime.spark import driver

    real, looks = driver._max_concurrent_tasks, []

    def registering(sc: Any) -> int:
        looks.append(1)
        return 1 if len(looks) < 4 else int(real(sc))

    monkeypatch.setattr(driver, "_max_concurrent_tasks", registering)
    caplog.set_level(logging.INFO, logger="sluice.spark")
    d = tempfile.mkdtemp()
    result = _tiny("waits", 2, d).run(runtime="spark", restore="none")
    assert result.status == "finished" and result.attempts == 1
    assert "attempt 0: waiting up to 180s (slot_wait_timeout) for 2 Spark task slot(s)" in caplog.text
    assert len(looks) >= 4


def test_dynamic_allocation_is_refused(spark: Any) -> None:
    d = tempfile.mkdtemp()
    spark._conf.set("spark.dynamicAllocation.enabled", "true")
    try:
        with pytest.raises(ConfigError, match=r"set spark.dynamicAllocation.enabled=false"):
            _tiny("dyn", 1, d).run(runtime="spark", restore="none")
    finally:
        spark._conf._jconf.remove("spark.dynamicAllocation.enabled")


def chatty(batch: pa.RecordBatch) -> pa.RecordBatch:
    logging.getLogger("sluice.user").warning("saw %d rows", batch.num_rows)
    return batch


def test_slot_logs_reach_the_driver(spark: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sluice")
    d = tempfile.mkdtemp()
    p = Pipeline("chatty", checkpoint=CheckpointConfig(interval=0.2, storage=f"{d}/chk"))
    s = p.source(GeneratorSource(num_splits=2, records_per_split=20, batch_size=10), parallelism=2)
    s.map_batches(chatty, name="chatty", parallelism=2).sink(
        TwoPhaseCommitTestSink(f"{d}/out"), parallelism=2
    )
    p.run(runtime="spark", restore="none")
    user = [r.getMessage() for r in caplog.records if r.name == "sluice.user"]
    # the slot and the subtask (by its chain's name) prefix every record
    assert any(m.startswith("[slot 0] [generator -> chatty -> test-sink (1/2)] saw 10 rows") for m in user), (
        user
    )
    assert any(m.startswith("[slot 1] [generator -> chatty -> test-sink (2/2)] saw") for m in user), user
    assert any("[slot 1]" in r.getMessage() and "runs" in r.getMessage() for r in caplog.records)


def test_tls_end_to_end(
    spark: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = self_signed(tempfile.mkdtemp())
    monkeypatch.setenv("SLUICE_TLS_CERT", cert)
    monkeypatch.setenv("SLUICE_TLS_KEY", key)
    caplog.set_level(logging.INFO, logger="sluice.spark")
    got, _ = run_shape_on("spark", shape_named("keyed"), 8)
    assert got == list(reference("keyed", 8))
    assert any("TLS on" in r.getMessage() for r in caplog.records)


def _resumable(d: str, rate: float | None) -> Pipeline:
    p = Pipeline(
        "resume-after-driver-restart",
        max_parallelism=16,
        checkpoint=CheckpointConfig(interval=0.2, storage=f"{d}/chk"),
        restart=FixedDelayRestart(attempts=2, delay=0.0),
    )
    src = GeneratorSource(num_splits=2, records_per_split=400, batch_size=10, rows_per_second=rate)
    s = p.source(src, parallelism=2).map_batches(with_key)
    s.key_by("k").process(RunningCount(), parallelism=2).sink(TwoPhaseCommitTestSink(f"{d}/out"))
    return p


def test_driver_restart_resumes_from_the_latest_checkpoint(spark: Any) -> None:
    ref_dir = tempfile.mkdtemp()
    _resumable(ref_dir, None).run(runtime="local", restore="none")
    expected = rows_of(read_committed(f"{ref_dir}/out"))
    d = tempfile.mkdtemp()
    client = _resumable(d, 80.0).start(runtime="spark", restore="none")
    deadline = time.monotonic() + 120
    while not any(s.status == "completed" for s in client.checkpoint_history):
        assert client.running and time.monotonic() < deadline, "no checkpoint completed"
        time.sleep(0.1)
    assert client.cancel().status == "cancelled"
    partial = rows_of(read_committed(f"{d}/out"))
    assert len(partial) < len(expected)
    result = _resumable(d, None).run(runtime="spark")  # restore="latest": a new driver resumes
    assert result.status == "finished"
    assert rows_of(read_committed(f"{d}/out")) == expected
