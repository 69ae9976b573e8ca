"""``sluice status JOB``: a running job's status, sources that cannot make progress (stalled: since when,
why), its vertices' throughput and backpressure, its last checkpoint and failures."""

from __future__ import annotations

import time
from typing import Any

import click

from sluice.cli.endpoint import (
    connect,
    emit_json,
    fmt_bytes,
    fmt_duration,
    fmt_number,
    job_options,
    print_table,
)
from sluice.cli.main import main
from sluice.errors import SluiceError

__all__ = ["checkpoint_line", "event_time", "stalled_line", "status"]


def stalled_line(s: dict[str, Any]) -> str:
    """One line about a stalled source: since when, how long, how many subtasks, why."""
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(s["since"])))
    return (
        f"STALLED: source {s['source']} cannot make progress since {since} ({fmt_duration(s.get('seconds'))}, "
        f"{s.get('subtasks', 1)} subtask(s)): {s['reason']}"
    )


def checkpoint_line(c: dict[str, Any] | None) -> str:
    """One line about a checkpoint: id, duration, size, alignment."""
    if not c:
        return "none yet"
    mode = "switched to unaligned" if c.get("switched_to_unaligned") else ("unaligned" if c.get("unaligned") else "aligned")
    ph = c.get("phases") or {}
    return (
        f"{c['checkpoint_id']} {c['status']} in {fmt_duration(c.get('duration_s'))} "
        f"(alignment {fmt_duration(ph.get('alignment_s'))}, sync {fmt_duration(ph.get('sync_s'))}, "
        f"async {fmt_duration(ph.get('async_s'))}), {fmt_bytes(c.get('state_bytes'))}, {mode}, "
        f"in-flight {fmt_bytes(c.get('inflight_bytes'))}"
    )


def event_time(ms: float | None) -> str:
    """A watermark (epoch milliseconds) as UTC date and time, or ``-`` before the first one."""
    if ms is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(ms) / 1000)) + " UTC"


@main.command()
@job_options
def status(job: str | None, storage: str, url: str | None, token_file: str | None, as_json: bool) -> None:
    """Show a running job: status, attempts, per-vertex throughput and backpressure, checkpoints, failures."""
    client = connect(job, storage, url, token_file)
    try:
        overview = client.get("/api/v1/job")
        metrics = client.get("/api/v1/metrics")
    except SluiceError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        emit_json({"job": overview, "metrics": metrics})
        return
    o = overview
    click.echo(
        f"job {o['job_id']}: {o['status']} on the {o['runtime']} runtime, attempt {o['attempt']} "
        f"({o['restarts']} restart(s)), up {fmt_duration(o['uptime_s'])}"
    )
    click.echo(f"endpoint {o['url']}   checkpoints in {o['checkpoint_storage']}")
    for s in o.get("stalled_sources") or []:
        click.echo(stalled_line(s))
    rows = []
    for v in metrics["vertices"]:
        r, t = v.get("rates") or {}, v.get("totals") or {}
        lag = (t.get("gauges") or {}).get("kafka_lag_records")
        rows.append(
            [
                v["name"],
                fmt_number(r.get("records_in_per_s")),
                # a sink emits nothing downstream: its out/s is what it writes
                fmt_number(r.get("sink_records_per_s") if v.get("sink") else r.get("records_out_per_s")),
                fmt_number(t.get("records_in")),
                f"{r['busy']:.0%}" if "busy" in r else "-",
                f"{r['backpressured']:.0%}" if "backpressured" in r else "-",
                "-" if lag is None else fmt_number(lag),
                sum((t.get("side_records") or {}).values()),
                event_time(t.get("watermark")),
            ]
        )
    columns = ["vertex", "in/s", "out/s", "in total", "busy", "backpressured", "kafka lag", "dead letters", "watermark"]
    print_table(columns, rows)
    counts = o.get("checkpoint_counts") or {}
    click.echo(
        f"checkpoints: {counts.get('completed', 0)} completed, {counts.get('failed', 0)} failed, "
        f"{counts.get('in_progress', 0)} in progress; last: {checkpoint_line(o.get('last_checkpoint'))}"
    )
    failed = o.get("last_failed_checkpoint")
    if failed:
        click.echo(f"last failed checkpoint: {failed['checkpoint_id']} {failed.get('failure_reason')}: {failed.get('failure_detail')}")
        for s in failed.get("stalled_sources") or []:
            click.echo(f"  it could not complete while source {s['source']} was stalled: {s['reason']}")
    for f in o.get("failures") or []:
        click.echo(f"attempt {f['attempt']} failed: {f['error']}")
