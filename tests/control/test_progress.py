"""The progress line of ``sluice run`` (issue 22): it says a job whose subtasks have not reported yet is
starting (Spark launching its slots) instead of ``read 0/s``, shows totals next to the rates (a short
burst of reading falls between two lines), prints a last line when the job ends, and labels Kafka lag
once."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sluice import CheckpointConfig, Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.control.monitor import JobMonitor
from sluice.control.progress import Progress, summary_line
from sluice.graph import SubtaskId
from sluice.runtime.status import JobLifecycle, JobStatus
from sluice.runtime.task_metrics import SINK_RECORDS, empty_snapshot
from sluice.sinks.testing import TwoPhaseCommitTestSink


class _Handle:
    """A Spark driver's handle on a subtask: no snapshot until its slot first reports."""

    def __init__(self) -> None:
        self.snapshot: dict[str, Any] | None = None

    def metrics_snapshot(self) -> dict[str, Any] | None:
        return self.snapshot


def _monitor(tmp_path: Path) -> tuple[JobMonitor, dict[SubtaskId, _Handle]]:
    p = Pipeline("progress", parallelism=2, checkpoint=CheckpointConfig(storage=str(tmp_path / "chk")))
    p.source(GeneratorSource(num_splits=2, records_per_split=10)).sink(TwoPhaseCommitTestSink(str(tmp_path / "o")))
    job = p.build()
    lifecycle = JobLifecycle("progress")
    lifecycle.transition(JobStatus.RUNNING)
    monitor = JobMonitor(job, p.job_config(), "spark", lifecycle)
    handles = {SubtaskId(v.id, i): _Handle() for v in job.vertices.values() for i in range(v.parallelism)}
    attempt = SimpleNamespace(
        tasks=handles, attempt=0, metrics={}, coordinator=None, failure=None, cancelled=False
    )
    monitor.attempt_started(attempt)  # type: ignore[arg-type]
    return monitor, handles


def test_a_job_whose_subtasks_have_not_reported_is_starting(tmp_path: Path) -> None:
    monitor, handles = _monitor(tmp_path)
    line = summary_line(monitor)
    assert "starting: none of 2 subtasks running yet" in line and "read 0/s" not in line, line
    for h in handles.values():
        h.snapshot = {**empty_snapshot(), "records_in": 1500, "counters": {SINK_RECORDS: 1500}}
    line = summary_line(monitor)
    assert "read 3.0k (0/s) written 3.0k (0/s)" in line and "starting" not in line, line


def test_the_last_line_is_printed_when_the_job_ends(tmp_path: Path) -> None:
    p = Pipeline("last-line", parallelism=1, checkpoint=CheckpointConfig(interval=0.1, storage=str(tmp_path / "chk")))
    p.source(GeneratorSource(num_splits=1, records_per_split=5000, batch_size=100)).sink(
        TwoPhaseCommitTestSink(str(tmp_path / "out"))
    )
    client = p.start(runtime="local", restore="none", control_endpoint=None)
    stream = io.StringIO()
    view = Progress(client.monitor, stream, interval=3600.0, live=False)  # no line while it runs
    view.start()
    client.wait(120)
    view.stop()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and "last-line finished" in lines[0] and "read 5.0k" in lines[0], lines


def test_an_expired_checkpoint_names_the_source_stalled_while_it_waited(tmp_path: Path) -> None:
    import time

    from sluice.checkpoint.stats import CheckpointStatsTracker

    monitor, handles = _monitor(tmp_path)
    since = time.time() - 30
    for sid, h in handles.items():
        stalled = {"since": since, "reason": "no Kafka broker reachable at b:9092: refused", "subtasks": 1}
        h.snapshot = {**empty_snapshot(), "stalled": stalled if sid.index == 0 else None}
    stats = CheckpointStatsTracker(lambda record: None, lambda what, exc: None)
    stats.triggered(7, since + 5, "checkpoint", "aligned")
    stats.failed(7, "EXPIRED", "no acknowledgement", 600.0)
    monitor.attempt.coordinator = SimpleNamespace(history=stats.history, stats=stats)  # type: ignore[union-attr]
    o = monitor.overview()
    (s,) = o["stalled_sources"]
    assert s["source"] == "generator" and s["subtasks"] == 1 and s["seconds"] >= 30 and "b:9092" in s["reason"]
    assert o["last_failed_checkpoint"]["stalled_sources"] == [s]
    assert "STALLED generator since" in summary_line(monitor)
