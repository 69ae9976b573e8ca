"""Click parameter types of the CLI: a duration flag reads as every duration of sluice does."""

from __future__ import annotations

from typing import Any

import click

from sluice.durations import Sign, to_seconds
from sluice.errors import ConfigError

__all__ = ["Duration"]


class Duration(click.ParamType):  # type: ignore[type-arg]  # generic from click 8.2 on only
    """A duration flag (:mod:`sluice.durations`): ``30``, ``'30 s'``, ``2m``, ``'1 h'``; float seconds."""

    name = "duration"

    def __init__(self, sign: Sign = "positive") -> None:
        self.sign: Sign = sign

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, float):
            return value
        try:  # a flag's bare number is seconds, as a bare number of the API
            value = float(value)
        except (TypeError, ValueError):
            pass
        option = f"--{param.name.replace('_', '-')}" if param is not None and param.name else "duration"
        try:
            return to_seconds(value, option, sign=self.sign)
        except ConfigError as exc:
            self.fail(str(exc).split(": ", 1)[1], param, ctx)
