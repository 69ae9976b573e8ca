"""The job's Prometheus metrics (prometheus_client), built from the :class:`~sluice.control.monitor.JobMonitor`
when they are scraped: nothing is recorded for Prometheus on the hot path.

:data:`METRICS` lists every built-in metric with its type, labels and meaning (docs/operations.md shows
the same list, and a test keeps the two in step). Besides those, every counter an operator, reader or
writer counts with ``ctx.metric(name, n)`` is exposed as ``sluice_<name>_total`` and every gauge set with
``ctx.gauge(name, value)`` as ``sluice_<name>``, with the labels ``job``, ``vertex`` and ``subtask``; a
counter whose name ends in ``_us`` (microseconds) is exposed in seconds (``commit_time_us`` ->
``sluice_commit_time_seconds_total``). Counters of the driver (global committers) carry
``vertex="_coordinator"``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from sluice.checkpoint.stats import DURATION_BUCKETS, CheckpointStatus
from sluice.control.monitor import JobMonitor, checkpoint_phases
from sluice.runtime.status import JobStatus

__all__ = ["DRIVER_VERTEX", "METRICS", "JobCollector", "job_registry", "user_metric_name"]

#: the ``vertex`` label of counters kept on the driver (global committers)
DRIVER_VERTEX = "_coordinator"

_T = ("job", "vertex", "subtask")
#: every built-in metric: (name, type, labels, meaning)
METRICS: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    (
        "sluice_task_records_in_total",
        "counter",
        _T,
        "records a subtask took in (a source: records its reader emitted)",
    ),
    ("sluice_task_records_out_total", "counter", _T, "records a subtask sent downstream"),
    ("sluice_task_bytes_in_total", "counter", _T, "Arrow buffer bytes of the batches taken in"),
    ("sluice_task_bytes_out_total", "counter", _T, "Arrow buffer bytes of the batches sent downstream"),
    ("sluice_task_batches_in_total", "counter", _T, "batches taken in"),
    ("sluice_task_batches_out_total", "counter", _T, "batches sent downstream"),
    ("sluice_task_busy_seconds_total", "counter", _T, "time spent processing"),
    ("sluice_task_idle_seconds_total", "counter", _T, "time spent waiting for input"),
    ("sluice_task_backpressured_seconds_total", "counter", _T, "time spent waiting for room in an output"),
    (
        "sluice_task_watermark_milliseconds",
        "gauge",
        _T,
        "the subtask's event time (absent before its first watermark)",
    ),
    ("sluice_task_side_output_records_total", "counter", (*_T, "tag"), "records sent to each side output"),
    ("sluice_task_dead_letter_records_total", "counter", _T, "records sent to the dead_letters side output"),
    (
        "sluice_source_stalled_seconds",
        "gauge",
        (*_T, "reason"),
        "how long a source subtask has been unable to make progress (e.g. no broker reachable; label reason), "
        "0 while it reads",
    ),
    ("sluice_job_status", "gauge", ("job", "status"), "1 for the job's current status, 0 for the others"),
    ("sluice_job_uptime_seconds", "gauge", ("job",), "seconds since the job started"),
    ("sluice_job_attempt", "gauge", ("job",), "the current attempt (0 first)"),
    ("sluice_job_restarts_total", "counter", ("job",), "restarts after failures"),
    ("sluice_checkpoints_total", "counter", ("job", "status"), "checkpoints completed and failed"),
    ("sluice_checkpoints_in_progress", "gauge", ("job",), "checkpoints in progress"),
    (
        "sluice_checkpoints_switched_to_unaligned_total",
        "counter",
        ("job",),
        "timeout-adaptive checkpoints that switched to unaligned",
    ),
    (
        "sluice_checkpoint_duration_seconds",
        "histogram",
        ("job",),
        "end-to-end duration of completed checkpoints",
    ),
    ("sluice_checkpoint_last_id", "gauge", ("job",), "id of the last completed checkpoint"),
    (
        "sluice_checkpoint_last_duration_seconds",
        "gauge",
        ("job",),
        "end-to-end duration of the last completed checkpoint",
    ),
    ("sluice_checkpoint_last_alignment_seconds", "gauge", ("job",), "its longest alignment over tasks"),
    ("sluice_checkpoint_last_sync_seconds", "gauge", ("job",), "its longest synchronous part over tasks"),
    ("sluice_checkpoint_last_async_seconds", "gauge", ("job",), "its longest asynchronous part over tasks"),
    ("sluice_checkpoint_last_size_bytes", "gauge", ("job",), "its state size"),
    (
        "sluice_checkpoint_last_inflight_bytes",
        "gauge",
        ("job",),
        "its persisted in-flight data (unaligned channel state)",
    ),
    (
        "sluice_checkpoint_last_unaligned",
        "gauge",
        ("job",),
        "1 if it was unaligned (or switched to unaligned)",
    ),
)
_BUILT_IN = {name for name, *_ in METRICS}
_BAD = re.compile(r"[^a-zA-Z0-9_]")


def user_metric_name(name: str, kind: str) -> tuple[str, float]:
    """The Prometheus name of a user counter (``kind="counter"``) or gauge, and the factor its values are
    multiplied by (a ``*_us`` counter is exposed in seconds)."""
    base = _BAD.sub("_", name).strip("_") or "unnamed"
    if kind == "counter":
        if base.endswith("_us"):
            return f"sluice_{base[:-3]}_seconds_total", 1e-6
        return f"sluice_{base}_total", 1.0
    return f"sluice_{base}", 1.0


class JobCollector(Collector):
    """Builds the job's metrics from its monitor at each scrape (a custom prometheus_client collector)."""

    def __init__(self, monitor: JobMonitor) -> None:
        self.monitor = monitor

    def collect(self) -> Iterator[Metric]:
        m = self.monitor
        job = m.config.job_id
        yield from self._tasks(job)
        yield from self._job(job)
        yield from self._checkpoints(job)

    def _tasks(self, job: str) -> Iterator[Metric]:
        m = self.monitor
        fams: dict[str, Any] = {}
        for name, kind, label_names, doc in METRICS:
            if name.startswith("sluice_task_"):
                cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
                fams[name] = cls(name.removesuffix("_total"), doc, labels=list(label_names))
        user: dict[str, Any] = {}

        def add_user(kind: str, raw: str, labels: list[str], value: float) -> None:
            name, factor = user_metric_name(raw, kind)
            if name in _BUILT_IN:
                return  # never shadow a built-in metric
            if name not in user:
                cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
                doc = f"{'counted' if kind == 'counter' else 'set'} by an operator, reader or writer: {raw}"
                user[name] = cls(name.removesuffix("_total"), doc, labels=["job", "vertex", "subtask"])
            user[name].add_metric(labels, value * factor)

        stalled = GaugeMetricFamily(
            "sluice_source_stalled_seconds",
            next(doc for name, _, _, doc in METRICS if name == "sluice_source_stalled_seconds"),
            labels=[*_T, "reason"],
        )
        now = time.time()
        for sid, snap in sorted(m.subtask_totals().items(), key=lambda kv: (kv[0].vertex, kv[0].index)):
            labels = [job, m.job.vertices[sid.vertex].name, str(sid.index)]
            if m.job.vertices[sid.vertex].is_source:
                stall = snap.get("stalled")
                seconds = max(0.0, now - float(stall["since"])) if stall else 0.0
                stalled.add_metric([*labels, stall["reason"] if stall else ""], seconds)
            for field in ("records_in", "records_out", "bytes_in", "bytes_out", "batches_in", "batches_out"):
                fams[f"sluice_task_{field}_total"].add_metric(labels, snap[field])
            for field in ("busy", "idle", "backpressured"):
                fams[f"sluice_task_{field}_seconds_total"].add_metric(labels, snap[f"{field}_s"])
            if snap.get("watermark") is not None:
                fams["sluice_task_watermark_milliseconds"].add_metric(labels, snap["watermark"])
            for tag, n in snap["side_records"].items():
                fams["sluice_task_side_output_records_total"].add_metric([*labels, tag], n)
            fams["sluice_task_dead_letter_records_total"].add_metric(
                labels, snap["side_records"].get("dead_letters", 0)
            )
            for raw, n in snap["counters"].items():
                add_user("counter", raw, labels, n)
            for raw, g in snap["gauges"].items():
                add_user("gauge", raw, labels, g)
        for raw, n in m.driver_counters().items():
            add_user("counter", raw, [job, DRIVER_VERTEX, "0"], n)
        yield from fams.values()
        yield stalled
        yield from user.values()

    def _job(self, job: str) -> Iterator[Metric]:
        m = self.monitor
        status = GaugeMetricFamily(
            "sluice_job_status", "1 for the job's current status", labels=["job", "status"]
        )
        current = m.lifecycle.status
        for s in JobStatus:
            status.add_metric([job, s.value], 1.0 if s is current else 0.0)
        yield status
        overview = m.overview()
        uptime = GaugeMetricFamily(
            "sluice_job_uptime_seconds", "seconds since the job started", labels=["job"]
        )
        uptime.add_metric([job], overview["uptime_s"])
        yield uptime
        if overview["attempt"] is not None:
            g = GaugeMetricFamily("sluice_job_attempt", "the current attempt (0 first)", labels=["job"])
            g.add_metric([job], overview["attempt"])
            yield g
        restarts = CounterMetricFamily("sluice_job_restarts", "restarts after failures", labels=["job"])
        restarts.add_metric([job], overview["restarts"])
        yield restarts

    def _checkpoints(self, job: str) -> Iterator[Metric]:
        history = self.monitor.checkpoints()
        counts, in_progress = self.monitor.checkpoint_counts()  # totals: the history keeps only the newest
        totals = CounterMetricFamily(
            "sluice_checkpoints", "checkpoints completed and failed", labels=["job", "status"]
        )
        totals.add_metric([job, CheckpointStatus.COMPLETED.value], counts.completed)
        totals.add_metric([job, CheckpointStatus.FAILED.value], counts.failed)
        yield totals
        pending = GaugeMetricFamily(
            "sluice_checkpoints_in_progress", "checkpoints in progress", labels=["job"]
        )
        pending.add_metric([job], in_progress)
        yield pending
        completed = [c for c in history if c.status is CheckpointStatus.COMPLETED]
        switched = CounterMetricFamily(
            "sluice_checkpoints_switched_to_unaligned", "adaptive checkpoints that switched", labels=["job"]
        )
        switched.add_metric([job], counts.switched_to_unaligned)
        yield switched
        buckets = [(str(b), float(n)) for b, n in zip(DURATION_BUCKETS, counts.duration_buckets, strict=True)]
        buckets.append(("+Inf", float(counts.completed)))
        hist = HistogramMetricFamily(
            "sluice_checkpoint_duration_seconds",
            "end-to-end duration of completed checkpoints",
            labels=["job"],
        )
        hist.add_metric([job], buckets, sum_value=counts.duration_s_sum)
        yield hist
        if not completed:
            return
        last = completed[-1].to_dict()
        phases = checkpoint_phases(last)
        values = {
            "sluice_checkpoint_last_id": last["checkpoint_id"],
            "sluice_checkpoint_last_duration_seconds": last["duration_s"],
            "sluice_checkpoint_last_alignment_seconds": phases["alignment_s"],
            "sluice_checkpoint_last_sync_seconds": phases["sync_s"],
            "sluice_checkpoint_last_async_seconds": phases["async_s"],
            "sluice_checkpoint_last_size_bytes": last["state_bytes"],
            "sluice_checkpoint_last_inflight_bytes": last["inflight_bytes"],
            "sluice_checkpoint_last_unaligned": 1.0 if last["unaligned"] else 0.0,
        }
        docs = {name: doc for name, _, _, doc in METRICS}
        for name, value in values.items():
            g = GaugeMetricFamily(name, docs[name], labels=["job"])
            g.add_metric([job], float(value))
            yield g


def job_registry(monitor: JobMonitor) -> CollectorRegistry:
    """A registry of its own for one job (so several jobs in one process never collide): the job's
    metrics and the process's (``process_cpu_seconds_total``, memory, open files)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(JobCollector(monitor))
    ProcessCollector(registry=registry)
    return registry
