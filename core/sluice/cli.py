"""The ``sluice`` command: run jobs, inspect checkpoints, scaffold jobs from templates, run the demo."""

from __future__ import annotations

import datetime as dt
import json
import logging
import runpy
import signal
import sys
import threading
import time
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import click

from sluice.api import Pipeline
from sluice.checkpoint.storage import CheckpointStorage, checkpoint_storage, parse_checkpoint_uri
from sluice.client import JobClient
from sluice.errors import SluiceError
from sluice.runtime.job import JobResult

__all__ = ["main"]


def load_pipeline(path: str) -> Pipeline:
    """Load a job file: it defines ``pipeline`` (a Pipeline) or ``build_pipeline() -> Pipeline``."""
    if not Path(path).is_file():
        raise click.BadParameter(f"no such job file: {path}", param_hint="JOB")
    ns = runpy.run_path(path, run_name="__sluice_job__")
    if isinstance(ns.get("pipeline"), Pipeline):
        return ns["pipeline"]  # type: ignore[no-any-return]
    if callable(ns.get("build_pipeline")):
        p = ns["build_pipeline"]()
        if isinstance(p, Pipeline):
            return p
    raise click.ClickException(
        f"{path} defines neither `pipeline = Pipeline(...)` nor `build_pipeline() -> Pipeline`"
    )


def _plugin_commands() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group="sluice.commands")}


class _PluginGroup(click.Group):
    """The ``sluice`` commands plus those other packages register in the ``sluice.commands`` entry point
    group (``sluice demo`` comes from ``sluice.templates``), loaded only when used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *_plugin_commands()})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        cmd = super().get_command(ctx, cmd_name)
        plugins = _plugin_commands()
        if cmd is None and cmd_name in plugins:
            loaded = plugins[cmd_name].load()
            cmd = loaded if isinstance(loaded, click.Command) else None
        return cmd


@click.group(cls=_PluginGroup)
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def main(verbose: int) -> None:
    """sluice: exactly-once ETL from Kafka into files and tables."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@main.command()
@click.argument("job", type=click.Path(dir_okay=False))
@click.option(
    "--runtime",
    type=click.Choice(["spark", "local"]),
    default="spark",
    show_default=True,
    help="spark: embedded local[P] unless --master is given; local: threads in this process (no JVM).",
)
@click.option(
    "--master", default=None, help="Spark master URL (default: spark-submit's, else embedded local[P])."
)
@click.option(
    "--restore",
    default="latest",
    show_default=True,
    help="'latest' (resume the job's latest completed checkpoint), 'none', or a checkpoint/savepoint path.",
)
@click.option(
    "--recover-without-channel-state",
    type=int,
    default=None,
    help="Drop the unaligned channel state of this checkpoint id on restore (LOSES its in-flight data).",
)
@click.option(
    "--allow-non-restored-state",
    is_flag=True,
    help="Restore even if the checkpoint holds state of operators (by uid) the job no longer has; that state "
    "is dropped. Without it such a restore fails, naming the uids.",
)
def run(
    job: str,
    runtime: str,
    master: str | None,
    restore: str,
    recover_without_channel_state: int | None,
    allow_non_restored_state: bool,
) -> None:
    """Run the pipeline defined in JOB (a Python file).

    SIGTERM (or Ctrl-C) stops the job with a savepoint (sources stop, the savepoint is its last checkpoint,
    sinks commit it) and prints the savepoint's path: resume with --restore PATH. A second signal while
    stopping cancels the job.
    """
    pipeline = load_pipeline(job)
    try:
        client = pipeline.start(
            runtime=runtime,  # type: ignore[arg-type]
            restore=restore,
            spark_master=master,
            recover_without_channel_state=recover_without_channel_state,
            allow_non_restored_state=allow_non_restored_state,
        )
        result = _wait_or_stop(client)
    except SluiceError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(
        f"job {result.job_id}: {result.status} after {result.attempts} attempt(s); "
        f"last checkpoint {result.last_checkpoint}"
    )
    if result.stopped_at:
        click.echo(f"stopped at {result.stopped_at}; resume with: sluice run {job} --restore {result.stopped_at}")


def _wait_or_stop(client: JobClient) -> JobResult:
    """Wait for the job; on SIGTERM/SIGINT stop it with a savepoint, on a second one cancel it."""
    signals: list[int] = []
    handler = lambda signum, frame: signals.append(signum)  # noqa: E731 - the main thread acts on it
    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while client.running:
            if signals:
                click.echo("stopping the job with a savepoint (signal again to cancel)", err=True)
                stopper = threading.Thread(target=_stop_quietly, args=(client,), daemon=True)
                stopper.start()
                while stopper.is_alive() and len(signals) < 2:
                    stopper.join(0.1)
                if len(signals) >= 2:
                    click.echo("cancelling the job", err=True)
                    return client.cancel()
                signals.clear()  # stopped, or the stop failed and the job goes on
                continue
            time.sleep(0.1)
        return client.wait()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _stop_quietly(client: JobClient) -> None:
    try:
        client.stop(savepoint=True)
    except SluiceError as exc:
        click.echo(f"stop with a savepoint failed, the job goes on: {exc}", err=True)


@main.group()
def checkpoints() -> None:
    """Inspect checkpoints in checkpoint storage."""


def _storage_for(uri: str, job: str | None) -> CheckpointStorage:
    if job is not None:
        return checkpoint_storage(uri, job)
    base, _, rest = uri.rstrip("/").rpartition("/")
    st = checkpoint_storage(base or ".", rest)
    if st.completed() or st.read_stats():
        return st
    root = checkpoint_storage(uri, "_")
    jobs = root.jobs()
    if len(jobs) == 1:
        return checkpoint_storage(uri, jobs[0])
    raise click.ClickException(f"{uri}: pass --job (jobs here: {', '.join(jobs) or 'none'})")


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
    """List the checkpoints of a job: id, status, duration, size, failure reason."""
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
        raise click.ClickException(f"job {st.job_id} has no checkpoint {checkpoint_id}")
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
        click.echo("  (* switched from aligned to unaligned after aligned_checkpoint_timeout)")


@main.command()
@click.argument("name")
@click.option(
    "--template",
    "template",
    default="kafka-to-parquet",
    show_default=True,
    help="Template to start from (see --list).",
)
@click.option("--dir", "directory", default=".", show_default=True, help="Where to create the job file.")
def new(name: str, template: str, directory: str) -> None:
    """Scaffold a job file NAME.py from a template."""
    from sluice.scaffold import render_template

    path = render_template(template, name, directory)
    click.echo(f"created {path}; run it with: sluice run {path}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
