"""The ``sluice`` command group: its global options and the commands other packages plug in."""

from __future__ import annotations

import logging
from importlib.metadata import entry_points
from typing import Any

import click

__all__ = ["main"]


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
