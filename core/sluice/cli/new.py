"""``sluice new``: scaffold a job file or a connector plugin package from a template."""

from __future__ import annotations

import json
import shlex
from importlib.metadata import distributions
from urllib.parse import unquote, urlparse

import click

from sluice.cli.main import main
from sluice.errors import ConfigError

__all__ = ["new"]


@main.command()
@click.argument("name", required=False)
@click.option(
    "--template",
    "template",
    default="kafka-to-parquet",
    show_default=True,
    help="Template to start from: a job, or 'source' / 'sink' for a plugin package (see --list).",
)
@click.option("--dir", "directory", default=".", show_default=True, help="Where to create the job or package.")
@click.option("--list", "list_templates", is_flag=True, help="List the templates and exit.")
def new(name: str | None, template: str, directory: str, list_templates: bool) -> None:
    """Scaffold a job file NAME.py, or a plugin package NAME/ (--template source|sink).

    NAME is words of letters and digits joined by - or _, starting with a letter, for jobs and plugins
    alike: a job my-job is written to my_job.py, a plugin my_plugin to the package my-plugin/ (distribution
    sluice-my-plugin, import package sluice_my_plugin).
    """
    from sluice.cli.scaffold import PLUGIN_TEMPLATES, describe_templates, render_template

    if list_templates:
        found = describe_templates()
        width = max(len(t.name) for t in found)  # the longest name still leaves a column between
        for t in found:
            click.echo(f"{t.name:<{width}}  {t.kind:<7} {t.description}")
        return
    if name is None:
        raise click.UsageError("give a NAME (or --list to see the templates)")
    try:
        path = render_template(template, name, directory)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    if template in PLUGIN_TEMPLATES:
        local = _local_sluice()
        first = f".venv/bin/pip install {shlex.quote(local)} && " if local else ""
        click.echo(
            f"created the {template} plugin package {path}; test it with:\n"
            f"  cd {path} && python -m venv .venv && {first}.venv/bin/pip install -e '.[test]' && "
            ".venv/bin/python -m pytest"
        )
    else:
        click.echo(f"created {path}; run it with: sluice run {path}")


def _local_sluice() -> str | None:
    """Where this sluice was installed from, if from a local checkout or wheel (PEP 610 ``direct_url.json``):
    a plugin's new virtualenv installs sluice-etl from there (it is not on the package index)."""
    # every copy on the path: a source checkout on sys.path also holds build metadata (sluice_etl.egg-info)
    for dist in distributions(name="sluice-etl"):
        try:
            url = str(json.loads(dist.read_text("direct_url.json") or "{}").get("url", ""))
        except ValueError:
            continue
        parsed = urlparse(url)
        if parsed.scheme == "file":
            return unquote(parsed.path)
    return None

