"""``sluice stop JOB [--savepoint] [--drain]``: stop a running job with a last checkpoint."""

from __future__ import annotations

import click

from sluice.cli.endpoint import connect, emit_json, job_options
from sluice.cli.main import main
from sluice.cli.params import Duration
from sluice.errors import SluiceError

__all__ = ["stop"]


@main.command()
@job_options
@click.option("--savepoint", is_flag=True, help="The last checkpoint is a self-contained savepoint.")
@click.option("--drain", is_flag=True, help="End the sources' input first: event time ends, every timer fires.")
@click.option(
    "--timeout",
    type=Duration(),
    default=600.0,
    show_default=True,
    help="How long to wait for the last checkpoint: seconds, or a duration such as '10 min'.",
)
def stop(
    job: str | None,
    storage: str,
    url: str | None,
    token_file: str | None,
    as_json: bool,
    savepoint: bool,
    drain: bool,
    timeout: float,
) -> None:
    """Stop a running job as Flink's stop: sources stop reading, a last checkpoint (with --savepoint a
    savepoint) is taken and committed, and the job ends `stopped`. Resume it with
    `sluice run JOB.py --restore PATH`. If the last checkpoint fails, the job goes on running."""
    client = connect(job, storage, url, token_file)
    body = {"savepoint": savepoint, "drain": drain, "timeout": timeout}
    try:
        result = client.post("/api/v1/stop", body, timeout=timeout + 60)
    except SluiceError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        emit_json(result)
    else:
        click.echo(f"job {result['status']} at {result['stopped_at']}; resume with: --restore {result['stopped_at']}")
