"""``sluice dashboard JOB``: the address of a running job's dashboard, with its login token."""

from __future__ import annotations

import webbrowser

import click

from sluice.cli.endpoint import connect, emit_json, job_options
from sluice.cli.main import main

__all__ = ["dashboard"]


@main.command()
@job_options
@click.option("--open", "open_browser", is_flag=True, help="Open it in the web browser.")
def dashboard(
    job: str | None, storage: str, url: str | None, token_file: str | None, as_json: bool, open_browser: bool
) -> None:
    """Print the address that opens a running job's dashboard and logs the browser in (it holds the job's
    token: keep it to yourself)."""
    client = connect(job, storage, url, token_file)
    address = client.login_url
    if as_json:
        emit_json({"url": client.url, "login_url": address})
    else:
        click.echo(address)
    if open_browser:
        webbrowser.open(address)
