"""``sluice run``: run a job file until it ends; SIGTERM stops it with a savepoint."""

from __future__ import annotations

import dataclasses
import shlex
import signal
import sys
import threading
import time
from typing import Any

import click
from click.core import ParameterSource

from sluice.api.pipeline import Pipeline, launched_by
from sluice.cli.jobfile import load_pipeline
from sluice.cli.main import main
from sluice.cli.params import Duration
from sluice.client import JobClient
from sluice.control.progress import Progress
from sluice.errors import SluiceError
from sluice.runtime.job import JobResult
from sluice.settings import configure, load_settings, parse_overrides

__all__ = ["load_pipeline", "run"]


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
    "--conf",
    "conf",
    type=click.Path(dir_okay=False),
    default=None,
    help="A YAML file of settings with Flink's key names (execution.checkpointing.interval: 30 s, "
    "state.checkpoints.dir, restart-strategy.*; see docs/configuration.md). Overrides the job's code.",
)
@click.option(
    "-D",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="One setting, e.g. -D execution.checkpointing.interval='30 s'. Overrides --conf and the code.",
)
@click.option(
    "--control-endpoint",
    default="127.0.0.1:0",
    show_default=True,
    help="HOST:PORT of the job's control endpoint and dashboard (port 0: a free one), or 'none'.",
)
@click.option(
    "--progress/--no-progress",
    default=True,
    show_default=True,
    help="Live progress on stderr (a table on a terminal, plain lines otherwise).",
)
@click.option(
    "--progress-interval",
    type=Duration(),
    default=10.0,
    show_default=True,
    help="Time between progress lines when stderr is not a terminal: seconds, or a duration such as '1 min'.",
)
@click.option(
    "--allow-non-restored-state",
    is_flag=True,
    help="Restore even if the checkpoint holds state of operators (by uid) the job no longer has; that state "
    "is dropped. Without it such a restore fails, naming the uids.",
)
@click.option(
    "--allow-changed-operators",
    is_flag=True,
    help="Restore operators whose state depends on settings that changed since the checkpoint (a window's size, "
    "a deduplication's horizon, key columns; docs/upgrades.md): the old state is read with the new settings. "
    "Without it such a restore fails, naming the operator and the change.",
)
@click.option(
    "--allow-reprocessing",
    is_flag=True,
    help="Run even if a sink's output already holds checkpoints newer than the one restored (an older "
    "checkpoint, or none after the checkpoint storage was lost): the data after it is written again "
    "(duplicates). Without it such a run is refused before it writes anything.",
)
def run(
    job: str,
    runtime: str,
    master: str | None,
    restore: str,
    recover_without_channel_state: int | None,
    allow_non_restored_state: bool,
    allow_reprocessing: bool,
    allow_changed_operators: bool,
    conf: str | None,
    overrides: tuple[str, ...],
    control_endpoint: str,
    progress: bool,
    progress_interval: float,
) -> None:
    """Run the pipeline defined in JOB (a Python file).

    JOB runs as `python JOB` would; its own `pipeline.run()` (any variable name, module level or under
    `if __name__ == "__main__":`) runs with these options. Without such a call the pipeline it defines
    (`pipeline`, `build_pipeline()`, or its one Pipeline) is run.

    SIGTERM (or Ctrl-C) stops the job with a savepoint (sources stop, the savepoint is its last checkpoint,
    sinks commit it) and prints the savepoint's path: resume with --restore PATH. A second signal while
    stopping cancels the job. While it runs, `sluice jobs`, `sluice status JOB_ID`, `sluice savepoint`,
    `sluice stop` and `sluice dashboard` reach it through its control endpoint.
    """
    ctx = click.get_current_context()
    explicit = {
        name
        for name in ctx.params
        if ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP, None)
    }
    launch = _Launch(
        job,
        {**(load_settings(conf) if conf else {}), **parse_overrides(overrides)},
        {
            "runtime": runtime,
            "restore": restore,
            "spark_master": master,
            "recover_without_channel_state": recover_without_channel_state,
            "allow_non_restored_state": allow_non_restored_state,
            "allow_reprocessing": allow_reprocessing,
            "allow_changed_operators": allow_changed_operators,
            "control_endpoint": control_endpoint,
        },
        {_CALL_NAME.get(name, name) for name in explicit},
        progress_interval if progress else None,
        _again(explicit, runtime, master, conf, overrides, control_endpoint),
    )
    with launched_by(launch):  # the file's own `p.run()` (any name, module level or __main__) runs here
        pipeline = load_pipeline(job, launched=lambda: launch.runs > 0)
    if pipeline is not None:
        launch(pipeline, {})


#: ``sluice run`` option -> the ``Pipeline.start`` argument it sets
_CALL_NAME = {"master": "spark_master"}


def _again(
    explicit: set[str],
    runtime: str,
    master: str | None,
    conf: str | None,
    overrides: tuple[str, ...],
    control_endpoint: str,
) -> list[str]:
    """The options given on this command line that a resumed run needs too (the runtime, the cluster, the
    settings, the endpoint), for the resume line a stopped job prints; the one-time ``--allow-*`` flags and
    ``--restore`` are left out."""
    args = ["--runtime", runtime] if "runtime" in explicit else []
    if master is not None and "master" in explicit:
        args += ["--master", master]
    if conf is not None:
        args += ["--conf", conf]
    for o in overrides:
        args += ["-D", o]
    if "control_endpoint" in explicit:
        args += ["--control-endpoint", control_endpoint]
    return args


class _Launch:
    """Runs a job file's pipeline with the command line's options: called by ``Pipeline.run()`` inside the
    file (as ``env.execute()`` under ``flink run``), else by ``sluice run`` on the pipeline the file defines.
    An option given on the command line wins over the call's argument; the call's wins over a default."""

    def __init__(
        self,
        job: str,
        settings: dict[str, Any],
        options: dict[str, Any],
        explicit: set[str],
        progress_interval: float | None,
        again: list[str] | None = None,
    ) -> None:
        self.job = job
        self.again = again or []
        self.settings = settings
        self.options = options
        self.explicit = explicit
        self.progress_interval = progress_interval
        self.runs = 0

    def __call__(self, pipeline: Pipeline, call: dict[str, Any]) -> JobResult:
        self.runs += 1
        kwargs = {**call}
        for name, value in self.options.items():
            if name in self.explicit or name not in call:
                kwargs[name] = value
        endpoint = kwargs.get("control_endpoint")
        if isinstance(endpoint, str) and endpoint.lower() == "none":
            kwargs["control_endpoint"] = None
        try:
            client = configure(pipeline, self.settings).start(**kwargs)
        except SluiceError as exc:
            exc.launched = True  # type: ignore[attr-defined]  # not the job file's line: the run's own error
            raise
        if client.control is not None:
            click.echo(
                f"job {client.config.job_id}: control endpoint and dashboard at {client.control.url} (token "
                f"in {client.control.token_file}); from another shell: sluice status {client.config.job_id} "
                f"--storage {client.config.checkpoint.storage}",
                err=True,
            )
        interval = self.progress_interval
        view = Progress(client.monitor, sys.stderr, interval) if interval is not None else None
        try:
            result = _wait_or_stop(client, view)
        finally:
            if client.control is not None:
                client.control.close()  # answers in flight (a stop) go out before the process ends
        click.echo(result.summary())
        if result.stopped_at:
            click.echo(f"stopped at {result.stopped_at}; resume with: {self.resume_line(result.stopped_at)}")
        # the file's own code gets the result: a template prints its line only when sluice run did not
        return dataclasses.replace(result, reported=True)


    def resume_line(self, restore: str) -> str:
        """The command that resumes this job from ``restore``: this one's options, ``--restore`` set."""
        return shlex.join(["sluice", "run", self.job, *self.again, "--restore", restore])


def _wait_or_stop(client: JobClient, view: Progress | None = None) -> JobResult:
    """Wait for the job (showing its progress); on SIGTERM/SIGINT stop it with a savepoint, on a second
    one cancel it."""
    signals: list[int] = []
    handler = lambda signum, frame: signals.append(signum)  # noqa: E731 - the main thread acts on it
    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    if view is not None:
        view.start()
    try:
        while client.running:
            if view is not None:
                view.tick()
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
        if view is not None:
            view.stop()
        for s, h in previous.items():
            signal.signal(s, h)


def _stop_quietly(client: JobClient) -> None:
    try:
        client.stop(savepoint=True)
    except SluiceError as exc:
        click.echo(f"stop with a savepoint failed, the job goes on: {exc}", err=True)
