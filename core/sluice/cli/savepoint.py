"""``sluice savepoint JOB``: take a savepoint of a running job."""

from __future__ import annotations

import click

from sluice.cli.endpoint import connect, emit_json, job_options
from sluice.cli.main import main
from sluice.cli.params import Duration
from sluice.errors import SluiceError

__all__ = ["savepoint"]


@main.command()
@job_options
@click.option(
    "--timeout",
    type=Duration(),
    default=600.0,
    show_default=True,
    help="How long to wait for the savepoint: seconds, or a duration such as '10 min'.",
)
def savepoint(
    job: str | None, storage: str, url: str | None, token_file: str | None, as_json: bool, timeout: float
) -> None:
    """Take an aligned savepoint of a running job and print its path (start a job from it with
    `sluice run JOB.py --restore PATH`); the job goes on running."""
    client = connect(job, storage, url, token_file)
    try:
        result = client.post("/api/v1/savepoint", {"timeout": timeout}, timeout=timeout + 60)
    except SluiceError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        emit_json(result)
    else:
        click.echo(f"savepoint {result['path']}")
