"""``sluice checkpoints list|show``: what checkpoint storage holds, read from its stats history (the newest
``CheckpointConfig.history_size`` checkpoints, :mod:`sluice.checkpoint.stats_log`)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import click

from sluice.checkpoint.history import expected_latest, latest_checkpoint
from sluice.checkpoint.storage import CheckpointStorage, parse_checkpoint_uri
from sluice.checkpoint.storage_loader import checkpoint_storage
from sluice.cli.main import main
from sluice.errors import ConfigError, RestoreError, SluiceError

__all__ = ["checkpoints"]


@main.group()
def checkpoints() -> None:
    """Inspect checkpoints in checkpoint storage."""


def _storage_for(uri: str, job: str | None) -> CheckpointStorage:
    """The storage of one job: ``uri`` is the storage base (with ``--job`` or a single job in it) or a
    job's own folder. Anything else is refused, saying what it is not."""
    if job is not None:
        st = checkpoint_storage(uri, job)
        if not st.holds_job():
            raise ConfigError(f"{uri} holds no checkpoints of job {job!r} (jobs there: {_names(uri)})")
        return st
    base, _, rest = uri.rstrip("/").rpartition("/")
    st = checkpoint_storage(base or ".", rest)
    if st.holds_job():
        return st
    jobs = checkpoint_storage(uri, "_").jobs()
    if len(jobs) == 1:
        return checkpoint_storage(uri, jobs[0])
    if jobs:
        raise ConfigError(f"{uri} holds several jobs: pass --job (one of {', '.join(jobs)})")
    raise ConfigError(
        f"{uri} is not checkpoint storage: it holds no job with checkpoints (<job>/chk-<n>/_metadata or "
        "<job>/_stats/). Pass the folder the job was given as CheckpointConfig.storage."
    )


def _names(uri: str) -> str:
    return ", ".join(checkpoint_storage(uri, "_").jobs()) or "none"


def _fmt_time(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


@checkpoints.command("list")
@click.argument("uri")
@click.option("--job", default=None, help="Job id (when URI holds several jobs).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_checkpoints(uri: str, job: str | None, as_json: bool) -> None:
    """List the newest checkpoints of a job: id, status, duration, size, failure reason."""
    st = _storage_for(uri, job)
    retained = {cid for cid, _, _ in st.completed()}
    rows = st.read_stats()
    if as_json:
        click.echo(json.dumps([{**r, "retained": r["checkpoint_id"] in retained} for r in rows], indent=1))
        return
    click.echo(f"job {st.job_id} in {st.base}")
    click.echo(
        f"{'id':>6}  {'status':<10} {'kind':<10} {'alignment':<14} {'started':<19} {'duration':>9} "
        f"{'size':>10} {'in-flight':>10}  retained  failure"
    )
    for r in rows:
        align = r.get("alignment", "")
        if r.get("switched_to_unaligned"):
            align = "adaptive->una"
        click.echo(
            f"{r['checkpoint_id']:>6}  {r['status']:<10} {r.get('kind', ''):<10} {align:<14} "
            f"{_fmt_time(r.get('trigger_time')):<19} {r.get('duration_s', 0):>8.3f}s {_size(r.get('state_bytes', 0)):>10} "
            f"{_size(r.get('inflight_bytes', 0)):>10}  {'yes' if r['checkpoint_id'] in retained else 'no':<8}  "
            f"{(r.get('failure_reason') or '') + (': ' + r['failure_detail'] if r.get('failure_detail') else '')}"
        )
    try:
        latest_checkpoint(st, expected_latest(st))
    except RestoreError as exc:  # what `sluice run --restore latest` would refuse
        click.echo(f"warning: {exc}")


@checkpoints.command("show")
@click.argument("uri")
@click.argument("checkpoint_id", required=False, type=int)
@click.option("--job", default=None, help="Job id (when URI holds several jobs).")
def show_checkpoint(uri: str, checkpoint_id: int | None, job: str | None) -> None:
    """Show one checkpoint: URI is <base>/<job>/chk-<n>, or a storage URI plus CHECKPOINT_ID."""
    if checkpoint_id is None:
        try:
            base, job_id, name = parse_checkpoint_uri(uri)
        except SluiceError as exc:
            raise click.ClickException(str(exc)) from exc
        st = checkpoint_storage(base, job_id)
        checkpoint_id = int(name.split("-")[1])
    else:
        st = _storage_for(uri, job)
    stats = [r for r in st.read_stats() if r["checkpoint_id"] == checkpoint_id]
    if not stats:
        raise click.ClickException(
            f"job {st.job_id} has no checkpoint {checkpoint_id} in its history (the newest checkpoints are kept: "
            "CheckpointConfig.history_size)"
        )
    r: dict[str, Any] = stats[-1]
    click.echo(f"checkpoint {checkpoint_id} of job {st.job_id}: {r['status']}")
    click.echo(
        f"  kind: {r.get('kind')}   alignment: {r.get('alignment')}"
        f"{'  (switched from aligned to unaligned)' if r.get('switched_to_unaligned') else ''}"
    )
    click.echo(
        f"  triggered: {_fmt_time(r.get('trigger_time'))}   end-to-end duration: {r.get('duration_s', 0):.3f}s"
    )
    click.echo(
        f"  state size: {_size(r.get('state_bytes', 0))}   persisted in-flight data: "
        f"{_size(r.get('inflight_bytes', 0))}"
    )
    if r.get("path"):
        click.echo(f"  path: {r['path']}")
    if r.get("failure_reason"):
        click.echo(f"  failure: {r['failure_reason']}: {r.get('failure_detail')}")
    tasks = r.get("tasks") or {}
    if tasks:
        click.echo(
            f"  {'subtask':<9} {'mode':<10} {'alignment':>10} {'sync':>9} {'async':>9} {'state':>10} {'in-flight':>10}"
        )
        for name, t in sorted(tasks.items()):
            mode = ("unaligned*" if t.get("switched") else "unaligned") if t.get("unaligned") else "aligned"
            click.echo(
                f"  {name:<9} {mode:<10} {t.get('alignment_s', 0):>9.4f}s {t.get('sync_s', 0):>8.4f}s "
                f"{t.get('async_s', 0):>8.4f}s {_size(t.get('state_bytes', 0)):>10} "
                f"{_size(t.get('inflight_bytes', 0)):>10}"
            )
        if any(t.get("unaligned") and t.get("switched") for t in tasks.values()):  # only for a mark shown
            click.echo("  (* switched from aligned to unaligned after aligned_checkpoint_timeout)")
