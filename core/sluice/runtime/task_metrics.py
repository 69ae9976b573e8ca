"""A subtask's built-in metrics: records, bytes and batches in and out, idle and backpressured time.

Counting is per batch, never per record, and lock-free: the task thread adds to plain attributes, and a
reader on another thread (the metrics sampler, a Spark slot's reporter) takes :meth:`TaskMetrics.snapshot`,
a plain dict of numbers, which the Spark runtime ships to the driver as it is. Records *out* are counted
by the task's :class:`~sluice.runtime.output.RecordWriter` s, side-output rows (dead letters) by its
:class:`~sluice.runtime.output.ChainOutput` s; user counters and gauges live in the operators' contexts.

A snapshot holds (every key always present):

* ``records_in`` / ``bytes_in`` / ``batches_in``: batches the task took in (for a source: what its reader
  emitted), their rows and Arrow bytes (the buffers a batch references, ``get_total_buffer_size``: a
  zero-copy slice of a larger batch counts the buffers it shares, which is what keeps counting O(1));
* ``records_out`` / ``bytes_out`` / ``batches_out``: what it sent downstream over its exchanges;
* ``elapsed_s``, ``idle_s``, ``backpressured_s``, ``busy_s``: time since the task started, spent waiting
  for input, waiting for room in an output, and the rest (processing);
* ``watermark``: the task's event time (None before its first watermark);
* ``side_records``: rows sent to each side output tag (``dead_letters`` ...);
* ``counters`` / ``gauges``: what operators, readers and writers counted (``ctx.metric``) and set
  (``ctx.gauge``), summed over the operator chain; among them :data:`SINK_RECORDS`, the rows handed to
  sink writers (a sink chained behind its source has no exchange to count them on);
* ``stalled``: None, or ``{"since": epoch s, "reason": text, "subtasks": n}`` while a source reader
  reports it cannot make progress (``ctx.stalled``); added up per vertex, the earliest since counts.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from sluice.operators.sinks import SINK_RECORDS

if TYPE_CHECKING:
    from sluice.graph import JobGraph, SubtaskId

__all__ = [
    "SINK_RECORDS",
    "SUMMED",
    "TaskMetrics",
    "add_totals",
    "empty_snapshot",
    "merge_attempt",
    "task_snapshot",
    "vertex_totals",
]

#: snapshot fields that add up over subtasks and attempts
SUMMED = (
    "records_in",
    "bytes_in",
    "batches_in",
    "records_out",
    "bytes_out",
    "batches_out",
    "elapsed_s",
    "idle_s",
    "backpressured_s",
    "busy_s",
)

_MIN_WATERMARK = -(2**63)


class _Counted(Protocol):
    records_out: int
    bytes_out: int
    batches_out: int


class _SideCounted(Protocol):
    side_records: dict[str, int]


class _Context(Protocol):
    metrics: dict[str, int]
    gauges: dict[str, float]


class TaskMetrics:
    """The counters one subtask's thread keeps (see the module docstring)."""

    __slots__ = ("backpressured_s", "batches_in", "bytes_in", "ended", "idle_s", "records_in", "started")

    def __init__(self) -> None:
        self.records_in = 0
        self.bytes_in = 0
        self.batches_in = 0
        self.idle_s = 0.0
        self.backpressured_s = 0.0
        self.started = time.monotonic()
        self.ended: float | None = None

    def count_in(self, rows: int, nbytes: int) -> None:
        """One batch taken in."""
        self.records_in += rows
        self.bytes_in += nbytes
        self.batches_in += 1

    def snapshot(
        self,
        writers: Iterable[_Counted],
        outputs: Iterable[_SideCounted],
        contexts: Iterable[_Context],
        watermark: int,
    ) -> dict[str, Any]:
        """The task's metrics now (safe to call from any thread: it only reads)."""
        snap = empty_snapshot()
        snap.update(records_in=self.records_in, bytes_in=self.bytes_in, batches_in=self.batches_in)
        for w in writers:
            snap["records_out"] += w.records_out
            snap["bytes_out"] += w.bytes_out
            snap["batches_out"] += w.batches_out
        elapsed = (self.ended or time.monotonic()) - self.started
        idle, bp = self.idle_s, self.backpressured_s
        snap.update(elapsed_s=elapsed, idle_s=idle, backpressured_s=bp, busy_s=max(0.0, elapsed - idle - bp))
        snap["watermark"] = watermark if watermark > _MIN_WATERMARK else None
        for out in outputs:
            for tag, n in dict(out.side_records).items():
                snap["side_records"][tag] = snap["side_records"].get(tag, 0) + n
        for ctx in contexts:
            # copies first: another thread (a reader's fetch thread) may add keys meanwhile
            for k, v in dict(ctx.metrics).items():
                snap["counters"][k] = snap["counters"].get(k, 0) + v
            for k, g in dict(ctx.gauges).items():
                snap["gauges"][k] = snap["gauges"].get(k, 0.0) + g
            stall = getattr(ctx, "stall", None)
            if stall is not None:
                snap["stalled"] = {"since": stall[0], "reason": stall[1], "subtasks": 1}
        return snap


def empty_snapshot() -> dict[str, Any]:
    """A snapshot of a task that did nothing yet."""
    snap: dict[str, Any] = dict.fromkeys(SUMMED, 0)
    snap.update(watermark=None, side_records={}, counters={}, gauges={}, stalled=None)
    return snap


def add_totals(totals: dict[str, Any], snap: Mapping[str, Any]) -> None:
    """Add ``snap`` into ``totals`` (a snapshot-shaped dict): sums, and the latest watermark and gauges."""
    for k in SUMMED:
        totals[k] = totals.get(k, 0) + snap.get(k, 0)
    for key in ("side_records", "counters"):
        acc = totals.setdefault(key, {})
        for name, n in (snap.get(key) or {}).items():
            acc[name] = acc.get(name, 0) + n
    gauges = totals.setdefault("gauges", {})
    for name, g in (snap.get("gauges") or {}).items():
        gauges[name] = gauges.get(name, 0.0) + g
    wm = snap.get("watermark")
    if wm is not None:
        totals["watermark"] = wm if totals.get("watermark") is None else min(totals["watermark"], wm)
    stall, acc_stall = snap.get("stalled"), totals.get("stalled")
    if stall:
        n = (acc_stall or {}).get("subtasks", 0) + stall.get("subtasks", 1)
        first = stall if not acc_stall or stall["since"] < acc_stall["since"] else acc_stall
        totals["stalled"] = {**first, "subtasks": n}


def task_snapshot(handle: Any) -> dict[str, Any] | None:
    """The metrics snapshot of a task handle (a local Task, or the Spark driver's handle on a remote
    subtask, which holds what its slot last reported), or None if it has none."""
    snap = getattr(handle, "metrics_snapshot", None)
    return snap() if callable(snap) else None


def vertex_totals(job: JobGraph, tasks: Mapping[SubtaskId, Any]) -> dict[str, dict[str, Any]]:
    """One attempt's task snapshots added up per vertex (by vertex name; watermark: the minimum)."""
    out: dict[str, dict[str, Any]] = {}
    for sid, handle in list(tasks.items()):
        snap = task_snapshot(handle)
        if snap is not None:
            add_totals(out.setdefault(job.vertices[sid.vertex].name, empty_snapshot()), snap)
    return out


def merge_attempt(job_totals: dict[Any, dict[str, Any]], attempt: Mapping[Any, Mapping[str, Any]]) -> None:
    """Fold one attempt's totals (per vertex, or per subtask) into the job's: sums add up, the watermark
    and gauges are the later attempt's."""
    for key, snap in attempt.items():
        acc = job_totals.setdefault(key, empty_snapshot())
        gauges, watermark = dict(snap.get("gauges") or {}), snap.get("watermark")
        acc["gauges"], acc["watermark"], acc["stalled"] = {}, None, None
        add_totals(acc, snap)
        acc["gauges"], acc["watermark"], acc["stalled"] = gauges, watermark, snap.get("stalled")
