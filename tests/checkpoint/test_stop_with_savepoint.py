"""Stop with a savepoint (Flink's stop-with-savepoint): the savepoint is the job's last checkpoint.

Sources stop, sinks commit the savepoint, the job ends ``stopped``; restoring the savepoint resumes it
with nothing lost and nothing twice. Without it, a savepoint taken while the job runs on and a cancel later
duplicate what later checkpoints committed (shown first). ``drain=True`` ends the input first, so
event-time timers fire. ``sluice run`` stops with a savepoint on SIGTERM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from sluice import CheckpointConfig, KeyedProcessFunction, NoRestart, Pipeline, ValueStateDescriptor
from sluice.connectors.generator import GeneratorSource
from sluice.errors import RestoreError
from sluice.sinks.testing import TwoPhaseCommitTestSink, read_committed

from tests.faults.expected import expected_rows
from tests.faults.shapes import Input, RunningCount, rows_of, with_key
from tests.sinks.tables.paced import Paced

ROWS = 3000


def build(tmp: Path, rate: float | None = 3000, parallelism: int = 2) -> Pipeline:
    p = Pipeline(
        "stoppable",
        parallelism=parallelism,
        checkpoint=CheckpointConfig(interval=0.1, storage=str(tmp / "chk")),
        restart=NoRestart(),
    )
    shape: dict[str, Any] = {"num_splits": 2, "records_per_split": ROWS // 2, "batch_size": 25}
    # ``rate`` set: paced by checkpoints too (two batches of a reader per completed checkpoint, 30
    # checkpoints to the end), so a stop after the first checkpoints comes before the end however slowly a
    # loaded machine runs the job (paced by time only, a loaded run once read all its input first)
    src = (
        GeneratorSource(**shape) if rate is None else Paced(chunk_batches=2, rows_per_second=rate, **shape)
    )
    p.source(src).map_batches(with_key).key_by("k").process(RunningCount(), name="counter").sink(
        TwoPhaseCommitTestSink(str(tmp / "out"))
    )
    return p


def committed(tmp: Path) -> list[tuple[Any, ...]]:
    return rows_of(read_committed(str(tmp / "out")))


def wait_for_checkpoints(client: Any, n: int) -> None:
    deadline = time.monotonic() + 60
    while sum(s.status == "completed" for s in client.checkpoint_history) < n:
        assert client.running and time.monotonic() < deadline, "the job completed no checkpoint"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def reference() -> list[tuple[Any, ...]]:
    """What the job must commit, computed from its input in plain Python (tests/faults/expected.py: the
    ``keyed`` shape is this job's with_key -> key_by -> RunningCount), not from another sluice run."""
    return list(expected_rows("keyed", [Input("generator", splits=2, per_split=ROWS // 2, offset=0)]))


def test_an_uninterrupted_run_commits_the_reference(tmp_path: Path, reference: list) -> None:  # type: ignore[type-arg]
    build(tmp_path, rate=None).run(runtime="local", restore="none")
    assert committed(tmp_path) == reference


def test_a_savepoint_without_stop_is_refused_on_restore(tmp_path: Path, reference: list) -> None:  # type: ignore[type-arg]
    """Why stop-with-savepoint exists: the job ran on after the savepoint and committed more, so restoring
    the savepoint would write that range again. The sink's lineage check refuses it before anything is
    written; only an explicit ``allow_reprocessing`` accepts the duplicates."""
    client = build(tmp_path).start(runtime="local", restore="none")
    wait_for_checkpoints(client, 1)
    savepoint = client.trigger_savepoint()
    wait_for_checkpoints(client, 4)
    client.cancel()
    before = committed(tmp_path)
    with pytest.raises(RestoreError, match="already holds checkpoint"):
        build(tmp_path, rate=None).run(runtime="local", restore=savepoint)
    assert committed(tmp_path) == before, "a refused restore writes nothing"
    build(tmp_path, rate=None).run(runtime="local", restore=savepoint, allow_reprocessing=True)
    assert len(committed(tmp_path)) > len(reference)


@pytest.mark.parametrize("savepoint", [True, False], ids=["savepoint", "checkpoint"])
def test_stop_then_restore_is_exactly_once(tmp_path: Path, reference: list, savepoint: bool) -> None:  # type: ignore[type-arg]
    client = build(tmp_path).start(runtime="local", restore="none")
    wait_for_checkpoints(client, 2)
    result = client.stop(savepoint=savepoint)
    assert result.status == "stopped" and client.status == "stopped"
    assert result.stopped_at is not None and ("savepoint-" in result.stopped_at) is savepoint
    partial = committed(tmp_path)
    assert 0 < len(partial) < len(reference), "the job stopped before its end, after committing some"
    assert result.checkpoints[-1].status == "completed", "the last checkpoint is the stop's"
    time.sleep(0.3)
    assert committed(tmp_path) == partial, "nothing is committed after the job stopped"
    again = build(tmp_path, rate=None).run(runtime="local", restore=result.stopped_at)
    assert again.status == "finished"
    assert committed(tmp_path) == reference


class CountOnTimer(KeyedProcessFunction):
    """Counts rows per key; emits the count when event time passes the key's timer (far in the future)."""

    def open(self, ctx: Any) -> None:
        self.count = ValueStateDescriptor("count", 0)

    def process(self, key: Any, rows: pa.RecordBatch, ctx: Any) -> None:
        c = ctx.state(self.count)
        if c.value() == 0:
            ctx.timer_service.register_event_time_timer(10**15)
        c.update(c.value() + rows.num_rows)

    def on_timer(self, timestamp: int, key: Any, ctx: Any) -> list[dict[str, Any]]:
        return [{"k": key, "count": ctx.state(self.count).value()}]


def test_stop_with_drain_fires_event_time_timers(tmp_path: Path) -> None:
    p = Pipeline("drain", checkpoint=CheckpointConfig(interval=0.1, storage=str(tmp_path / "chk")))
    src = GeneratorSource(num_splits=1, records_per_split=10**6, batch_size=20, rows_per_second=2000)
    p.source(src).map_batches(with_key).key_by("k").process(CountOnTimer(), name="count").sink(
        TwoPhaseCommitTestSink(str(tmp_path / "out"))
    )
    client = p.start(runtime="local", restore="none")
    wait_for_checkpoints(client, 2)
    result = client.stop(drain=True)
    assert result.status == "stopped" and result.stopped_at and "savepoint-" in result.stopped_at
    rows = read_committed(str(tmp_path / "out"))
    assert rows is not None and rows.num_rows == 8, "every key's timer fired when event time ended"
    assert sum(rows.column("count").to_pylist()) > 0


def test_a_failed_stop_leaves_the_job_running(tmp_path: Path, reference: list) -> None:  # type: ignore[type-arg]
    from sluice import CheckpointError

    client = build(tmp_path).start(runtime="local", restore="none")
    wait_for_checkpoints(client, 1)
    with pytest.raises(CheckpointError):
        client.stop(timeout=0.0001)  # the savepoint cannot complete in time
    assert client.status == "running"
    assert client.wait().status == "finished"
    assert committed(tmp_path) == reference


JOB = textwrap.dedent(
    """
    import os
    from sluice import CheckpointConfig, Pipeline
    from sluice.connectors.generator import GeneratorSource
    from sluice.sinks.testing import TwoPhaseCommitTestSink

    pipeline = Pipeline("sigterm", parallelism=2,
                        checkpoint=CheckpointConfig(interval=0.1, storage=os.environ["JOB_DIR"] + "/chk"))
    rate = float(os.environ["JOB_RATE"]) or None
    src = GeneratorSource(num_splits=2, records_per_split=2000, batch_size=25, rows_per_second=rate)
    pipeline.source(src).sink(TwoPhaseCommitTestSink(os.environ["JOB_DIR"] + "/out"))
    """
)


def test_sigterm_stops_sluice_run_with_a_savepoint(tmp_path: Path) -> None:
    job = tmp_path / "job.py"
    job.write_text(JOB)
    env = {**os.environ, "JOB_DIR": str(tmp_path), "JOB_RATE": "1500"}
    cmd = [sys.executable, "-m", "sluice.cli", "run", str(job), "--runtime", "local"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while not list((tmp_path / "chk").glob("*/chk-*/_metadata")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.stdout else ""
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert "stopped after" in out and "--restore" in out, out
    savepoint = out.split("--restore ")[-1].strip()
    assert "savepoint-" in savepoint, out
    partial = read_committed(str(tmp_path / "out"))
    assert partial is not None and 0 < partial.num_rows < 4000
    env["JOB_RATE"] = "0"
    rest = subprocess.run([*cmd, "--restore", savepoint], env=env, capture_output=True, text=True, timeout=120)
    assert rest.returncode == 0 and "finished" in rest.stdout, rest.stdout + rest.stderr
    ids = sorted(read_committed(str(tmp_path / "out")).column("id").to_pylist())  # type: ignore[union-attr]
    assert ids == list(range(4000))


@pytest.mark.spark
def test_stop_with_savepoint_on_spark(spark: Any, tmp_path: Path, reference: list) -> None:  # type: ignore[type-arg]
    client = build(tmp_path).start(runtime="spark", restore="none")
    wait_for_checkpoints(client, 2)
    result = client.stop()
    assert result.status == "stopped" and result.stopped_at and "savepoint-" in result.stopped_at
    assert 0 < len(committed(tmp_path)) < len(reference)
    build(tmp_path, rate=None).run(runtime="spark", restore=result.stopped_at)
    assert committed(tmp_path) == reference
