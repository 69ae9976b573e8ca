"""``sluice dashboard JOB [--open]``: log a browser in to a running job's dashboard with a one-time code.

The address it prints holds a login code, never the job's token: the first browser that opens it within
two minutes gets a session (a cookie valid on that endpoint only) and after that, or later, the code is
worth nothing. ``--open`` puts nothing secret on the browser's command line, which every local user can
read with ``ps``: it writes a page that forwards to the login address into a private temporary directory
(the page readable by this user only), opens that page, waits until the browser used the code (or the code
expired), and removes the page.
"""

from __future__ import annotations

import html
import os
import shutil
import tempfile
import time
import webbrowser
from pathlib import Path
from typing import Any

import click

from sluice.cli.endpoint import connect, emit_json, job_options
from sluice.cli.main import main
from sluice.control.client import ControlClient
from sluice.errors import SluiceError

__all__ = ["dashboard"]

_FORWARD = """<!doctype html>
<meta charset="utf-8"><meta name="referrer" content="no-referrer">
<meta http-equiv="refresh" content="0;url={url}">
<title>sluice: logging in</title>
"""


@main.command()
@job_options
@click.option("--open", "open_browser", is_flag=True, help="Log the web browser in and open the dashboard.")
def dashboard(
    job: str | None, storage: str, url: str | None, token_file: str | None, as_json: bool, open_browser: bool
) -> None:
    """Print an address that logs a browser in to a running job's dashboard: it holds a one-time login
    code (valid for one browser, two minutes), not the job's token. With --open, open it in the web
    browser (without putting the code on the browser's command line)."""
    client = connect(job, storage, url, token_file)
    try:
        grant = client.login_code()
        if open_browser:
            state = _open_in_browser(client, grant)
    except SluiceError as exc:
        raise click.ClickException(str(exc)) from exc
    if not open_browser:
        if as_json:
            emit_json({"url": client.url, "login_url": grant["login_url"], "expires_in_s": grant["expires_in_s"]})
        else:
            click.echo(grant["login_url"])
            click.echo(
                f"(a one-time login code: it logs in one browser within {grant['expires_in_s']:.0f}s; "
                "run `sluice dashboard` again for another)",
                err=True,
            )
        return
    if state != "used":
        raise click.ClickException(
            f"the browser did not open the login page within {grant['expires_in_s']:.0f}s; run `sluice "
            "dashboard JOB` and open the address it prints"
        )
    if as_json:
        emit_json({"url": client.url, "logged_in": True})
    else:
        click.echo(f"logged the browser in to the dashboard at {client.url}")


def _open_in_browser(client: ControlClient, grant: dict[str, Any]) -> str:
    """Open the login address through a private page; the code's state once the browser used it (or not)."""
    folder = tempfile.mkdtemp(prefix="sluice-login-")  # mode 0700
    page = Path(folder) / "login.html"
    try:
        fd = os.open(page, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(_FORWARD.format(url=html.escape(str(grant["login_url"]), quote=True)))
        if not webbrowser.open(page.as_uri()):
            raise click.ClickException(
                "no web browser could be started; run `sluice dashboard JOB` and open the address it prints"
            )
        deadline = time.monotonic() + float(grant["expires_in_s"])
        while True:
            state = str(client.get(f"/api/v1/login-codes/{grant['code']}")["state"])
            if state != "pending" or time.monotonic() > deadline:
                return state
            time.sleep(0.25)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
