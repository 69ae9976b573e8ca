"""The one way sluice reads a duration: in the API, the configuration file, ``-D`` overrides and the CLI.

A duration is

* a :class:`datetime.timedelta`;
* a string: a number and a unit, ``"250ms"``, ``"30 s"``, ``"1m"``, ``"1.5 min"``, ``"1 h"``, ``"2 days"``
  (units ``ms``, ``s``, ``m`` / ``min``, ``h``, ``d`` and their long forms, as Flink writes them);
* a bare number (int or float): **seconds**, as Python's own timeouts (``time.sleep``, ``socket``,
  ``asyncio``) and every earlier seconds option of sluice. An option whose name ends in ``_ms`` or ``_s``
  reads a bare number in that unit (its name says so).

Flink's configuration keys (``--conf`` files, ``-D``) refuse a bare number: Flink reads it as milliseconds,
sluice's Python options as seconds, so a value copied from a Flink deployment would be off by a thousand.

Anything else is one :class:`~sluice.errors.ConfigError` line naming the option and the allowed forms.
"""

from __future__ import annotations

import datetime
import math
import numbers
import re
from typing import Any, Literal

from sluice.errors import ConfigError

__all__ = ["FORMS", "Bare", "Duration", "Sign", "to_ms", "to_seconds"]

#: what an option that takes a duration accepts
Duration = int | float | str | datetime.timedelta

_UNITS = {
    "ms": 0.001, "milli": 0.001, "millis": 0.001, "millisecond": 0.001, "milliseconds": 0.001,
    "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
    "m": 60.0, "min": 60.0, "mins": 60.0, "minute": 60.0, "minutes": 60.0,
    "h": 3600.0, "hr": 3600.0, "hour": 3600.0, "hours": 3600.0,
    "d": 86400.0, "day": 86400.0, "days": 86400.0,
}  # fmt: skip
_TEXT = re.compile(r"\s*([+-]?)\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]+)\s*", re.IGNORECASE)
_BARE = re.compile(r"\s*[+-]?\s*(\d+(?:\.\d*)?|\.\d+)\s*")

#: the allowed forms, as every error message names them
FORMS = "a number of seconds, a timedelta, or a number with a unit ('250ms', '30 s', '1m', '1 h', '1d')"
_CONF_FORMS = "a number with a unit (ms, s, m or min, h, d), e.g. '30 s'"

Sign = Literal["positive", "non-negative", "any"]
Bare = Literal["s", "ms", "refuse"]


def to_seconds(value: Any, option: str, *, sign: Sign = "positive", bare: Bare = "s") -> float:
    """Seconds in the duration ``value`` (module docstring); ConfigError naming ``option`` otherwise.

    Args:
        value: the duration.
        option: how the error names the option, e.g. ``"Tumbling(size)"``.
        sign: ``"positive"`` (> 0), ``"non-negative"`` (>= 0) or ``"any"``.
        bare: what a bare number is: ``"s"`` (seconds), ``"ms"`` (an option named ``..._ms``), or
            ``"refuse"`` (Flink's configuration keys).
    """
    seconds = _parse(value, option, bare)
    if not math.isfinite(seconds):
        raise ConfigError(f"{option}: must be a finite duration (got {value!r})")
    if (sign == "positive" and seconds <= 0) or (sign == "non-negative" and seconds < 0):
        raise ConfigError(f"{option}: must be a duration {'> 0' if sign == 'positive' else '>= 0'} (got {value!r})")
    return seconds


def to_ms(value: Any, option: str, *, sign: Sign = "positive", bare: Bare = "s") -> int:
    """Whole milliseconds in the duration ``value`` (as :func:`to_seconds`; a positive duration under one
    millisecond is refused rather than rounded to 0)."""
    if isinstance(value, datetime.timedelta):
        ms = value // datetime.timedelta(milliseconds=1)
    else:
        ms = round(to_seconds(value, option, sign="any", bare=bare) * 1000)
    seconds = to_seconds(value, option, sign=sign, bare=bare)  # the sign check, on the value as given
    if ms == 0 and seconds != 0:
        raise ConfigError(f"{option}: {value!r} is less than a millisecond (the smallest duration here)")
    return int(ms)


def _parse(value: Any, option: str, bare: Bare) -> float:
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        if bare == "refuse":
            raise ConfigError(f"{option}: {value!r} is not a duration: write {_CONF_FORMS} (a bare number is "
                              "refused: Flink reads it as milliseconds, sluice's Python options as seconds)")
        return float(value) / 1000 if bare == "ms" else float(value)
    if isinstance(value, str):
        m = _TEXT.fullmatch(value)
        if m is not None and m.group(3).lower() in _UNITS:
            magnitude = float(m.group(2)) * _UNITS[m.group(3).lower()]
            return -magnitude if m.group(1) == "-" else magnitude
        if _BARE.fullmatch(value) and bare == "refuse":
            raise ConfigError(f"{option}: {value!r} is not a duration: write {_CONF_FORMS} (a bare number is "
                              "refused: Flink reads it as milliseconds, sluice's Python options as seconds)")
        if _BARE.fullmatch(value):
            raise ConfigError(f"{option}: {value!r} is a number in a string: give a unit (e.g. '{value.strip()} s'), "
                              "or the number itself for seconds")
    forms = _CONF_FORMS if bare == "refuse" else FORMS.replace("seconds", "milliseconds") if bare == "ms" else FORMS
    raise ConfigError(f"{option}: {value!r} is not a duration: give {forms}")
