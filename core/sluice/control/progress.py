"""The live progress of ``sluice run``: a table redrawn in place on a terminal (rich), plain lines otherwise.

It reads the job's :class:`~sluice.control.monitor.JobMonitor` in this process (no HTTP): records read and
written (in total and per second), each vertex's rates, busy and backpressured share and Kafka lag,
sources that cannot make progress (stalled: since when and why), the last checkpoint (id, duration, size,
aligned or not), attempts and the last failure. Until a subtask has reported (Spark starting its slots), it
says the job is starting rather than reading nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import IO, Any

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from sluice.control.monitor import JobMonitor
from sluice.control.units import fmt_bytes, fmt_duration, fmt_number
from sluice.runtime.task_metrics import SINK_RECORDS

__all__ = ["Progress", "stalled_text", "summary_line"]


def _checkpoint(c: dict[str, Any] | None) -> str:
    if not c:
        return "no checkpoint yet"
    mode = (
        "switched" if c.get("switched_to_unaligned") else ("unaligned" if c.get("unaligned") else "aligned")
    )
    return f"checkpoint {c['checkpoint_id']} {c['duration_s']:.2f}s {fmt_bytes(c.get('state_bytes'))} {mode}"


@dataclass
class _Figures:
    """What the progress shows of the job as a whole."""

    read: float = 0.0
    written: float = 0.0
    read_total: int = 0
    written_total: int = 0
    #: per source (its name): its Kafka lag
    lags: dict[str, float] = field(default_factory=dict)
    #: subtasks that reported metrics, of all
    reporting: int = 0
    subtasks: int = 0

    def flow(self) -> str:
        if self.reporting == 0 and self.subtasks:
            return f"starting: none of {self.subtasks} subtasks running yet"
        return (
            f"read {fmt_number(self.read_total)} ({fmt_number(self.read)}/s) "
            f"written {fmt_number(self.written_total)} ({fmt_number(self.written)}/s)"
        )

    def lag(self) -> str:
        if not self.lags:
            return ""
        if len(self.lags) == 1:
            return f"kafka lag {fmt_number(next(iter(self.lags.values())))} records"
        return "kafka lag: " + ", ".join(f"{name} {fmt_number(n)}" for name, n in self.lags.items())


def _figures(monitor: JobMonitor, metrics: dict[str, Any]) -> _Figures:
    """Records read by the sources and written by the sinks (total, per second), Kafka lag, subtasks."""
    f = _Figures()
    for v in metrics["vertices"]:
        vertex = monitor.job.vertices[v["id"]]
        r, t = v.get("rates") or {}, v.get("totals") or {}
        f.subtasks += vertex.parallelism
        f.reporting += len(v.get("subtasks") or ())
        if vertex.is_source:
            f.read += r.get("records_in_per_s", 0.0)
            f.read_total += int(t.get("records_in") or 0)
            g = (t.get("gauges") or {}).get("kafka_lag_records")
            if g is not None:
                f.lags[vertex.chain[0].name] = g
        f.written += r.get(f"{SINK_RECORDS}_per_s", 0.0)
        f.written_total += int((t.get("counters") or {}).get(SINK_RECORDS, 0))
    if not monitor.config.metrics:
        f.reporting = f.subtasks  # nothing is counted, so nothing reports: not a sign of starting
    return f


def stalled_text(stalled: list[dict[str, Any]], width: int = 200) -> str:
    """``STALLED`` and each stalled source: since when, for how long, why (empty if none is)."""
    if not stalled:
        return ""
    parts = [
        f"{s['source']} since {time.strftime('%H:%M:%S', time.localtime(s['since']))} "
        f"({fmt_duration(s['seconds'])}, {s['subtasks']} subtask(s)): {s['reason'][:width]}"
        for s in stalled
    ]
    return "STALLED " + "; ".join(parts)


def summary_line(monitor: JobMonitor) -> str:
    """One plain line of progress (for logs and output that is not a terminal)."""
    o = monitor.overview()
    metrics = monitor.metrics()
    f = _figures(monitor, metrics)
    parts = [
        time.strftime("%H:%M:%S"),
        f"{o['job_id']} {o['status']} (attempt {o['attempt']}, {o['restarts']} restart(s))",
        f.flow(),
    ]
    if f.lags:
        parts.append(f.lag())
    if o.get("stalled_sources"):
        parts.append(stalled_text(o["stalled_sources"]))
    bp = [
        f"{monitor.job.vertices[v['id']].chain[0].name} {v['rates']['backpressured']:.0%}"
        for v in metrics["vertices"]
        if (v.get("rates") or {}).get("backpressured", 0.0) >= 0.01
    ]
    parts.append("backpressured: " + (", ".join(bp) if bp else "none"))
    parts.append(_checkpoint(o.get("last_checkpoint")))
    failures = o.get("failures") or []
    if failures:
        f = failures[-1]
        parts.append(f"last failure (attempt {f['attempt']}): {f['error'][:160]}")
    return " | ".join(parts)


class Progress:
    """Shows a job's progress on ``stream`` until :meth:`stop`; call :meth:`tick` often (it redraws at
    most every ``refresh`` seconds on a terminal, and prints a line every ``interval`` seconds otherwise).

    Args:
        monitor: The job's monitor.
        stream: Where to draw (``sluice run`` uses stderr, so stdout keeps only the result).
        interval: Seconds between plain lines when ``stream`` is not a terminal.
        live: Force the live table (True) or plain lines (False); default: live on a terminal.
    """

    def __init__(
        self, monitor: JobMonitor, stream: IO[str], interval: float = 10.0, live: bool | None = None
    ) -> None:
        self.monitor = monitor
        self.interval = interval
        self._console = Console(file=stream, highlight=False)
        self._live_mode = self._console.is_terminal if live is None else live
        self._live: Live | None = None
        self._last = 0.0
        self.refresh = 1.0
        monitor.start_sampling()

    def start(self) -> None:
        if self._live_mode:
            self._live = Live(self._render(), console=self._console, auto_refresh=False, transient=False)
            self._live.start()
        self._last = time.monotonic()

    def tick(self) -> None:
        now = time.monotonic()
        if self._live is not None:
            if now - self._last >= self.refresh:
                self._last = now
                self._live.update(self._render(), refresh=True)
        elif now - self._last >= self.interval:
            self._last = now
            self._console.print(summary_line(self.monitor), soft_wrap=True)

    def stop(self) -> None:
        if self._live is not None:
            self._live.update(self._render(), refresh=True)
            self._live.stop()
            self._live = None
        elif self._last:  # the last figures: a short job may end between two lines
            self._console.print(summary_line(self.monitor), soft_wrap=True)

    def _render(self) -> Group:
        m = self.monitor
        o = m.overview()
        metrics = m.metrics()
        f = _figures(m, metrics)
        stalled = o.get("stalled_sources") or []
        head = Text.assemble(
            (f"{o['job_id']} ", "bold"),
            (o["status"], "green" if o["status"] == "running" and not stalled else "yellow"),
            f"  attempt {o['attempt']} ({o['restarts']} restart(s))  {f.flow()}",
            f"  {f.lag()}" if f.lags else "",
        )
        table = Table(
            "vertex", "par", "in/s", "out/s", "busy", "backpressured", "kafka lag", box=box.SIMPLE_HEAD
        )
        for v in metrics["vertices"]:
            r, t = v.get("rates") or {}, v.get("totals") or {}
            g = (t.get("gauges") or {}).get("kafka_lag_records")
            bp = r.get("backpressured")
            table.add_row(
                v["name"],
                str(m.job.vertices[v["id"]].parallelism),
                fmt_number(r.get("records_in_per_s")),
                fmt_number(r.get("records_out_per_s")),
                "-" if "busy" not in r else f"{r['busy']:.0%}",
                Text("-" if bp is None else f"{bp:.0%}", style="red" if (bp or 0) > 0.5 else ""),
                "-" if g is None else fmt_number(g),
            )
        lines: list[Any] = [head, table, Text(_checkpoint(o.get("last_checkpoint")))]
        if stalled:
            lines.insert(1, Text(stalled_text(stalled, 300), style="bold red"))
        failures = o.get("failures") or []
        if failures:
            f = failures[-1]
            lines.append(Text(f"last failure (attempt {f['attempt']}): {f['error'][:300]}", style="red"))
        return Group(*lines)
