"""The ``sluice`` command group: its global options and the commands other packages plug in."""

from __future__ import annotations

import logging
from importlib.metadata import entry_points
from typing import Any

import click

from sluice.errors import SluiceError

__all__ = ["main"]

log = logging.getLogger("sluice.cli")


def _plugin_commands() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group="sluice.commands")}


class _PluginGroup(click.Group):
    """The ``sluice`` commands plus those other packages register in the ``sluice.commands`` entry point
    group (``sluice demo`` comes from ``sluice.templates``), loaded only when used.

    A :class:`~sluice.errors.SluiceError` from any command prints as one line (``Error: ...``) and exits 1;
    ``sluice -v ...`` logs its traceback too.
    """

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SluiceError as exc:
            if ctx.meta.get("sluice.verbose"):
                log.error("%s", exc, exc_info=exc)
            text = " ".join(str(exc).split())  # one line, whatever the message holds
            raise click.ClickException(text) from exc

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
@click.version_option(package_name="sluice-etl", prog_name="sluice", message="%(prog)s %(version)s")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
@click.pass_context
def main(ctx: click.Context, verbose: int) -> None:
    """sluice: exactly-once ETL from Kafka into files and tables."""
    ctx.meta["sluice.verbose"] = verbose
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
