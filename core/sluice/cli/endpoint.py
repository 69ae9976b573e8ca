"""What the verbs that talk to a running job share: how they find it, and how they print.

A job is found by its id in the registry of its checkpoint storage (``--storage``, default
``./checkpoints`` or ``$SLUICE_CHECKPOINT_STORAGE``), or directly at ``--url`` (with ``--token-file`` or
``$SLUICE_CONTROL_TOKEN``).
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click
from rich import box
from rich.console import Console
from rich.table import Table

from sluice.control.client import ControlClient
from sluice.control.units import fmt_bytes, fmt_duration, fmt_number
from sluice.errors import SluiceError

__all__ = [
    "STORAGE_ENV",
    "connect",
    "emit_json",
    "fmt_bytes",
    "fmt_duration",
    "fmt_number",
    "job_options",
    "print_table",
    "storage_option",
]

STORAGE_ENV = "SLUICE_CHECKPOINT_STORAGE"
F = TypeVar("F", bound=Callable[..., Any])


def storage_option(fn: F) -> F:
    """``--storage``: the checkpoint storage whose registry lists the jobs."""
    return click.option(
        "--storage",
        default="./checkpoints",
        show_default=True,
        envvar=STORAGE_ENV,
        help=f"Checkpoint storage the job writes to (its registry lists running jobs); or ${STORAGE_ENV}.",
    )(fn)


def job_options(fn: F) -> F:
    """JOB, ``--storage``, ``--url``, ``--token-file`` and ``--json``."""
    for option in (
        click.option("--json", "as_json", is_flag=True, help="Machine-readable output."),
        click.option("--token-file", default=None, help="The job's token file (default: the registry's)."),
        click.option("--url", default=None, help="The job's control endpoint (instead of the registry)."),
        storage_option,
        click.argument("job", required=False),
    ):
        fn = option(fn)
    return fn


def connect(job: str | None, storage: str, url: str | None, token_file: str | None) -> ControlClient:
    """A client for the job, or a click error saying what is wrong."""
    try:
        return ControlClient.connect(job, storage, url, token_file)
    except SluiceError as exc:
        raise click.ClickException(str(exc)) from exc


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=1, default=str))


def print_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> None:
    """A short table on stdout (as wide as the terminal, or 200 columns when not a terminal)."""
    width = shutil.get_terminal_size((200, 24)).columns if sys.stdout.isatty() else 200
    console = Console(width=width, highlight=False, soft_wrap=False)
    table = Table(*columns, box=box.SIMPLE_HEAD, title=title, title_justify="left", pad_edge=False)
    for row in rows:
        table.add_row(*(str(c) for c in row))
    console.print(table)

