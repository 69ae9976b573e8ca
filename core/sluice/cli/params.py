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
        typed, number = value, None
        try:  # a flag's bare number is seconds, as a bare number of the API
            number = float(value)
        except (TypeError, ValueError):
            pass
        option = f"--{param.name.replace('_', '-')}" if param is not None and param.name else "duration"
        try:
            return to_seconds(value if number is None else number, option, sign=self.sign)
        except ConfigError as exc:
            message = str(exc).split(": ", 1)[1]
            if number is not None:  # say what was typed (`--timeout 0`), not the float it became
                message = message.replace(f"(got {number!r})", f"(got {typed!r})")
            self.fail(message, param, ctx)
