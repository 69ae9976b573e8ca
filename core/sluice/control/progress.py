"""The live progress of ``sluice run``: a table redrawn in place on a terminal (rich), plain lines otherwise.

It reads the job's :class:`~sluice.control.monitor.JobMonitor` in this process (no HTTP): records read and
written per second, each vertex's rates, busy and backpressured share and Kafka lag, the last checkpoint
(id, duration, size, aligned or not), attempts and the last failure.
"""

from __future__ import annotations

import time
from typing import IO, Any

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from sluice.control.monitor import JobMonitor
from sluice.control.units import fmt_bytes, fmt_number
from sluice.runtime.task_metrics import SINK_RECORDS

__all__ = ["Progress", "summary_line"]


def _checkpoint(c: dict[str, Any] | None) -> str:
    if not c:
        return "no checkpoint yet"
    mode = (
        "switched" if c.get("switched_to_unaligned") else ("unaligned" if c.get("unaligned") else "aligned")
    )
    return f"checkpoint {c['checkpoint_id']} {c['duration_s']:.2f}s {fmt_bytes(c.get('state_bytes'))} {mode}"


def _job_rates(monitor: JobMonitor, metrics: dict[str, Any]) -> tuple[float, float, dict[str, float]]:
    """Records read by the sources and written by the sinks per second, and each source's Kafka lag."""
    read = written = 0.0
    lags: dict[str, float] = {}
    for v in metrics["vertices"]:
        vertex = monitor.job.vertices[v["id"]]
        r = v.get("rates") or {}
        if vertex.is_source:
            read += r.get("records_in_per_s", 0.0)
            g = (v.get("totals") or {}).get("gauges", {}).get("kafka_lag_records")
            if g is not None:
                lags[vertex.chain[0].name] = g
        written += r.get(f"{SINK_RECORDS}_per_s", 0.0)
    return read, written, lags


def summary_line(monitor: JobMonitor) -> str:
    """One plain line of progress (for logs and output that is not a terminal)."""
    o = monitor.overview()
    metrics = monitor.metrics()
    read, written, lag = _job_rates(monitor, metrics)
    parts = [
        time.strftime("%H:%M:%S"),
        f"{o['job_id']} {o['status']} (attempt {o['attempt']}, {o['restarts']} restart(s))",
        f"read {fmt_number(read)}/s written {fmt_number(written)}/s",
    ]
    if lag:
        parts.append("kafka lag " + ", ".join(f"{name} {fmt_number(n)}" for name, n in lag.items()))
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

    def _render(self) -> Group:
        m = self.monitor
        o = m.overview()
        metrics = m.metrics()
        read, written, lag = _job_rates(m, metrics)
        head = Text.assemble(
            (f"{o['job_id']} ", "bold"),
            (o["status"], "green" if o["status"] == "running" else "yellow"),
            f"  attempt {o['attempt']} ({o['restarts']} restart(s))  read {fmt_number(read)}/s  written {fmt_number(written)}/s",
            ("  kafka lag " + ", ".join(f"{name} {fmt_number(n)}" for name, n in lag.items())) if lag else "",
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
        failures = o.get("failures") or []
        if failures:
            f = failures[-1]
            lines.append(Text(f"last failure (attempt {f['attempt']}): {f['error'][:300]}", style="red"))
        return Group(*lines)
