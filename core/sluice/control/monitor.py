"""What the driver knows of a running job, across its attempts: the view behind the control endpoint, the
dashboard, the CLI and ``sluice run``'s live progress.

A :class:`JobMonitor` belongs to one :class:`~sluice.client.JobClient`, which tells it when an attempt
starts and when the job ends. It reads the attempt's tasks (in-process :class:`~sluice.runtime.task.Task`
s, or the Spark driver's handles, which hold what each slot last reported) and its coordinator only when
asked, so it costs the job nothing between requests; counters of ended attempts are folded in, so totals
never go back across a restart. A sampler thread (started by whoever shows rates) takes the totals once a
second and keeps a few minutes of them, from which per-second rates and busy / backpressured ratios come.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from typing import Any

from sluice.checkpoint.stats import CheckpointCounts, CheckpointStats, CheckpointStatus
from sluice.config.job import JobConfig
from sluice.graph import JobGraph, NodeKind, SubtaskId
from sluice.runtime.attempt import JobAttempt
from sluice.runtime.status import JobLifecycle
from sluice.runtime.task_metrics import SINK_RECORDS, add_totals, empty_snapshot, merge_attempt, task_snapshot

__all__ = ["RATE_FIELDS", "JobMonitor", "checkpoint_dict", "checkpoint_phases"]

#: per-second rates the sampler derives for each vertex
RATE_FIELDS = ("records_in", "records_out", "bytes_in", "bytes_out")
_RATE_WINDOW_S = 5.0
_SAMPLE_EVERY_S = 1.0
_KEEP_SAMPLES = 300


def checkpoint_phases(stats: dict[str, Any]) -> dict[str, float]:
    """A checkpoint's phases: the longest alignment, synchronous and asynchronous part over its tasks."""
    tasks = (stats.get("tasks") or {}).values()
    return {
        phase: max((float(t.get(phase) or 0.0) for t in tasks), default=0.0)
        for phase in ("alignment_s", "sync_s", "async_s")
    }


class JobMonitor:
    """One job's attempts, metrics, checkpoints and failures, as the driver sees them (thread-safe).

    Args:
        job: The job graph.
        cfg: The job's configuration.
        runtime: ``"local"`` or ``"spark"``.
        lifecycle: The job's status.
    """

    def __init__(self, job: JobGraph, cfg: JobConfig, runtime: str, lifecycle: JobLifecycle) -> None:
        self.job = job
        self.config = cfg
        self.runtime = runtime
        self.lifecycle = lifecycle
        self.started_at = time.time()
        self._lock = threading.Lock()
        self._attempt: JobAttempt | None = None
        self._attempts = 0
        #: per subtask, the totals of ended attempts
        self._folded: dict[SubtaskId, dict[str, Any]] = {}
        #: the driver's own counters (global commits) of ended attempts
        self._folded_driver: dict[str, int] = {}
        #: the newest checkpoints of ended attempts, their totals, and the newest failed one
        self._checkpoints: deque[CheckpointStats] = deque(maxlen=cfg.checkpoint.history_size)
        self._counts = CheckpointCounts()
        self._latest_failed: CheckpointStats | None = None
        self._failures: list[dict[str, Any]] = []
        self._samples: deque[tuple[float, dict[str, dict[str, float]]]] = deque(maxlen=_KEEP_SAMPLES)
        self._ended = threading.Event()
        self._sampler: threading.Thread | None = None

    # -- told by the JobClient -------------------------------------------------------------------------
    def attempt_started(self, attempt: JobAttempt) -> None:
        """A new attempt runs: the previous one (it ended) is folded into the totals."""
        with self._lock:
            previous, self._attempt = self._attempt, attempt
            self._attempts += 1
            if previous is not None:
                self._fold(previous)

    def job_ended(self) -> None:
        """The job ended (whatever its status): the sampler stops."""
        self._ended.set()

    def _fold(self, a: JobAttempt) -> None:
        live = {sid: snap for sid, h in list(a.tasks.items()) if (snap := task_snapshot(h)) is not None}
        merge_attempt(self._folded, live)
        for snap in self._folded.values():
            snap["stalled"] = None  # the attempt ended: its stalls with it
        for k, v in dict(a.metrics).items():
            self._folded_driver[k] = self._folded_driver.get(k, 0) + v
        if a.coordinator is not None:
            self._checkpoints.extend(a.coordinator.history)
            self._counts = CheckpointCounts.total([self._counts, a.coordinator.stats.counts])
            self._latest_failed = a.coordinator.stats.latest_failed or self._latest_failed
        if a.failure is not None and not a.cancelled:
            self._failures.append({"attempt": a.attempt, "time": time.time(), "error": a.failure_text()})

    # -- what it knows ---------------------------------------------------------------------------------
    @property
    def attempt(self) -> JobAttempt | None:
        """The current (or last) attempt."""
        return self._attempt

    @property
    def attempts(self) -> int:
        """Attempts started so far (restarts + 1)."""
        return self._attempts

    def subtask_totals(self) -> dict[SubtaskId, dict[str, Any]]:
        """Every subtask's metrics, summed over attempts (gauges and watermark: the current attempt's)."""
        with self._lock:
            a = self._attempt
            out = {sid: _copy(snap) for sid, snap in self._folded.items()}
        if a is not None:
            live = {sid: snap for sid, h in list(a.tasks.items()) if (snap := task_snapshot(h)) is not None}
            merge_attempt(out, live)
        return out

    def vertex_totals(
        self, subtasks: dict[SubtaskId, dict[str, Any]] | None = None
    ) -> dict[int, dict[str, Any]]:
        """The subtasks' totals added up per vertex id (watermark: the minimum over subtasks)."""
        out: dict[int, dict[str, Any]] = {v: empty_snapshot() for v in self.job.vertices}
        for sid, snap in (subtasks if subtasks is not None else self.subtask_totals()).items():
            add_totals(out[sid.vertex], snap)
        return out

    def driver_counters(self) -> dict[str, int]:
        """Counters of the driver side (global committers), summed over attempts."""
        with self._lock:
            out = dict(self._folded_driver)
            a = self._attempt
        for k, v in dict(a.metrics if a is not None else {}).items():
            out[k] = out.get(k, 0) + v
        return out

    def checkpoints(self) -> list[CheckpointStats]:
        """The newest checkpoints (``CheckpointConfig.history_size``) over the attempts so far, oldest first."""
        with self._lock:
            out = list(self._checkpoints)
            a = self._attempt
        if a is not None and a.coordinator is not None:
            out.extend(list(a.coordinator.history))
        return out[-self.config.checkpoint.history_size :]

    def checkpoint_counts(self) -> tuple[CheckpointCounts, int]:
        """Totals over every checkpoint of every attempt so far, and how many are in progress now."""
        with self._lock:
            counts = self._counts
            a = self._attempt
        if a is None or a.coordinator is None:
            return counts, 0
        return CheckpointCounts.total([counts, a.coordinator.stats.counts]), a.coordinator.stats.in_progress

    def latest_failed_checkpoint(self) -> CheckpointStats | None:
        """The newest checkpoint that failed, however long ago."""
        with self._lock:
            latest = self._latest_failed
            a = self._attempt
        if a is not None and a.coordinator is not None and a.coordinator.stats.latest_failed is not None:
            return a.coordinator.stats.latest_failed
        return latest

    def failures(self) -> list[dict[str, Any]]:
        """Failed attempts: ``{"attempt", "time", "error"}`` (the root cause first, then what followed)."""
        with self._lock:
            out = list(self._failures)
            a = self._attempt
        if a is not None and a.failure is not None and not a.cancelled:
            if not out or out[-1]["attempt"] != a.attempt:
                out.append({"attempt": a.attempt, "time": time.time(), "error": a.failure_text()})
        return out

    # -- rates -----------------------------------------------------------------------------------------
    def start_sampling(self) -> None:
        """Start the once-a-second sampler that rates come from (idempotent; it ends with the job)."""
        with self._lock:
            if self._sampler is not None or self._ended.is_set():
                return
            self._sampler = threading.Thread(
                target=self._sample_loop, name="sluice-metrics-sampler", daemon=True
            )
        self._sample()
        self._sampler.start()

    def _sample_loop(self) -> None:
        while not self._ended.wait(_SAMPLE_EVERY_S):
            self._sample()

    def _sample(self) -> None:
        fields = (*RATE_FIELDS, "busy_s", "idle_s", "backpressured_s", "elapsed_s")
        totals = self.vertex_totals()
        point = {
            str(v): {
                **{f: float(t.get(f, 0)) for f in fields},
                SINK_RECORDS: float((t.get("counters") or {}).get(SINK_RECORDS, 0)),
            }
            for v, t in totals.items()
        }
        with self._lock:
            self._samples.append((time.monotonic(), point))

    def rates(self) -> dict[int, dict[str, float]]:
        """Per vertex over the last few seconds: ``<field>_per_s`` for :data:`RATE_FIELDS`, and the share
        of time its subtasks were ``busy``, ``idle`` and ``backpressured`` (0..1). Empty until the sampler
        has two samples."""
        with self._lock:
            samples = list(self._samples)
        if len(samples) < 2:
            return {}
        t1, last = samples[-1]
        t0, first = next(((t, p) for t, p in samples if t1 - t <= _RATE_WINDOW_S + 0.5), samples[-2])
        if t1 - t0 <= 0:
            t0, first = samples[-2]
        out: dict[int, dict[str, float]] = {}
        for v, now in last.items():
            then = first.get(v, {})
            dt = max(t1 - t0, 1e-9)
            r = {
                f"{f}_per_s": max(0.0, (now[f] - then.get(f, 0.0)) / dt) for f in (*RATE_FIELDS, SINK_RECORDS)
            }
            wall = now["elapsed_s"] - then.get("elapsed_s", 0.0)
            for f in ("busy_s", "idle_s", "backpressured_s"):
                share = (now[f] - then.get(f, 0.0)) / wall if wall > 0 else 0.0
                r[f.removesuffix("_s")] = min(1.0, max(0.0, share))
            out[int(v)] = r
        return out

    def history(self) -> list[dict[str, Any]]:
        """Throughput over the last minutes: ``{"time", "records_in_per_s", "records_out_per_s"}`` of the
        job's sources (records read) and sinks (records written), one point per sample."""
        with self._lock:
            samples = list(self._samples)
        sources = [str(v.id) for v in self.job.vertices.values() if v.is_source]
        now_wall, now_mono = time.time(), time.monotonic()
        out = []
        for (t0, a), (t1, b) in itertools.pairwise(samples):
            dt = max(t1 - t0, 1e-9)
            read = sum(b[v]["records_in"] - a.get(v, {}).get("records_in", 0.0) for v in sources if v in b)
            written = sum(n[SINK_RECORDS] - a.get(v, {}).get(SINK_RECORDS, 0.0) for v, n in b.items())
            out.append(
                {
                    "time": now_wall - (now_mono - t1),
                    "read_per_s": max(0.0, read / dt),
                    "written_per_s": max(0.0, written / dt),
                }
            )
        return out

    # -- views -----------------------------------------------------------------------------------------
    def graph(self) -> dict[str, Any]:
        """The job graph: vertices (chained operators) with their parallelism, and the exchanges."""
        vertices = []
        for v in self.job.vertices.values():
            vertices.append(
                {
                    "id": v.id,
                    "name": v.name,
                    "uid": v.uid,
                    "parallelism": v.parallelism,
                    "source": v.is_source,
                    "sink": any(n.kind is NodeKind.SINK for n in v.chain),
                    "operators": [{"name": n.name, "uid": n.uid, "kind": n.kind.value} for n in v.chain],
                    "inputs": [
                        {
                            "from": e.upstream,
                            "partitioning": e.partitioning.value,
                            "unaligned_ok": e.unaligned_ok,
                        }
                        for e in v.inputs
                    ],
                }
            )
        return {
            "job_id": self.config.job_id,
            "max_parallelism": self.job.max_parallelism,
            "vertices": vertices,
        }

    def overview(self) -> dict[str, Any]:
        """Status, attempts, failures and the last checkpoint: what ``sluice status`` and ``jobs`` show."""
        checkpoints = self.checkpoints()
        totals, in_progress = self.checkpoint_counts()
        counts = {
            CheckpointStatus.IN_PROGRESS.value: in_progress,
            CheckpointStatus.COMPLETED.value: totals.completed,
            CheckpointStatus.FAILED.value: totals.failed,
        }
        completed = [c for c in checkpoints if c.status is CheckpointStatus.COMPLETED]
        failed = self.latest_failed_checkpoint()
        a = self._attempt
        stalled = [] if self.lifecycle.status.is_terminal else self.stalled_sources()
        last_failed = checkpoint_dict(failed) if failed is not None else None
        if last_failed is not None and last_failed.get("failure_reason") == "EXPIRED":
            ended = float(last_failed.get("trigger_time") or 0) + float(self.config.checkpoint.timeout)
            # what kept it from completing, if a source stalled before it expired and still is
            last_failed["stalled_sources"] = [s for s in stalled if s["since"] <= ended]
        return {
            "job_id": self.config.job_id,
            "status": self.lifecycle.status.value,
            "runtime": self.runtime,
            "started_at": self.started_at,
            "uptime_s": time.time() - self.started_at,
            "attempt": a.attempt if a is not None else None,
            "restarts": max(0, self._attempts - 1),
            "status_history": [[s.value, t] for s, t in list(self.lifecycle.history)],
            "failures": self.failures(),
            "checkpoint_counts": counts,
            "last_checkpoint": checkpoint_dict(completed[-1]) if completed else None,
            "last_failed_checkpoint": last_failed,
            "stalled_sources": stalled,
            "checkpoint_storage": self.config.checkpoint.storage,
            "parallelism": max(v.parallelism for v in self.job.vertices.values()),
        }

    def stalled_sources(self, totals: dict[int, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """Sources whose readers report they cannot make progress (e.g. no broker reachable): per vertex,
        ``{"source", "vertex", "since" (epoch s), "seconds", "reason", "subtasks"}`` of its earliest stall."""
        totals = totals if totals is not None else self.vertex_totals()
        now = time.time()
        out = []
        for v in self.job.vertices.values():
            s = totals.get(v.id, {}).get("stalled")
            if v.is_source and s:
                out.append({"source": v.chain[0].name, "vertex": v.name, **s, "seconds": max(0.0, now - float(s["since"]))})
        return out

    def metrics(self) -> dict[str, Any]:
        """Per vertex: totals, rates and per-subtask figures (the dashboard's and ``sluice status``' view)."""
        subtasks = self.subtask_totals()
        totals = self.vertex_totals(subtasks)
        rates = self.rates()
        vertices = []
        for v in self.job.vertices.values():
            per = [
                {
                    "index": sid.index,
                    **{k: subtasks[sid].get(k) for k in ("records_in", "records_out", "watermark", "stalled")},
                }
                for sid in sorted((s for s in subtasks if s.vertex == v.id), key=lambda s: s.index)
            ]
            vertices.append(
                {
                    "id": v.id,
                    "name": v.name,
                    "sink": any(n.kind is NodeKind.SINK for n in v.chain),
                    "totals": totals[v.id],
                    "rates": rates.get(v.id, {}),
                    "subtasks": per,
                }
            )
        return {
            "job_id": self.config.job_id,
            "status": self.lifecycle.status.value,
            "time": time.time(),
            "metrics_enabled": self.config.metrics,
            "vertices": vertices,
            "driver": self.driver_counters(),
            "throughput": self.history(),
        }


def checkpoint_dict(stats: CheckpointStats, with_tasks: bool = False) -> dict[str, Any]:
    """A checkpoint's statistics as JSON, with its phases (:func:`checkpoint_phases`)."""
    d = stats.to_dict()
    d["phases"] = checkpoint_phases(d)
    if not with_tasks:
        d.pop("tasks", None)
    return d


def _copy(snap: dict[str, Any]) -> dict[str, Any]:
    out = dict(snap)
    for k in ("side_records", "counters", "gauges"):
        out[k] = dict(snap.get(k) or {})
    return out
