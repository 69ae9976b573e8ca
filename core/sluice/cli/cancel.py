"""``sluice cancel JOB``: cancel a running job."""

from __future__ import annotations

import click

from sluice.cli.endpoint import connect, emit_json, job_options
from sluice.cli.main import main
from sluice.errors import SluiceError

__all__ = ["cancel"]


@main.command()
@job_options
def cancel(job: str | None, storage: str, url: str | None, token_file: str | None, as_json: bool) -> None:
    """Cancel a running job at once, without a last checkpoint (its retained checkpoints stay unless the
    job sets retain_on_cancel=False). To end it so it can resume exactly, use `sluice stop`."""
    client = connect(job, storage, url, token_file)
    try:
        result = client.post("/api/v1/cancel", timeout=660)
    except SluiceError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        emit_json(result)
    else:
        click.echo(f"job {result['status']}")
