"""``sluice new``: scaffold a job file from a template."""

from __future__ import annotations

import click

from sluice.cli.main import main

__all__ = ["new"]


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
    from sluice.cli.scaffold import render_template

    path = render_template(template, name, directory)
    click.echo(f"created {path}; run it with: sluice run {path}")
