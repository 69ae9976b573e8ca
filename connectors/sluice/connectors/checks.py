"""Field checks for the connectors' options models (frozen pydantic models, as :mod:`sluice.config`).

A field is annotated with what it allows, and pydantic's own coercion is skipped (``SkipValidation``), so
a value is taken as given or refused with one line naming the option::

    batch_size: Annotated[int, SkipValidation, must("KafkaSource", "an integer >= 1", is_count(1))] = 100

refuses ``0`` with ``ConfigError("KafkaSource: batch_size must be an integer >= 1 (got 0)")``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BeforeValidator, ValidationInfo
from sluice.errors import ConfigError

__all__ = ["convert", "is_count", "must"]


def must(owner: str, allowed: str, ok: Callable[[Any], bool], option: str | None = None) -> BeforeValidator:
    """A field check: ``ok(value)``, else ConfigError "<owner>: <option> must be <allowed> (got <value>)";
    ``option`` defaults to the field's name."""

    def check(value: Any, info: ValidationInfo) -> Any:
        if not ok(value):
            raise ConfigError(f"{owner}: {option or info.field_name} must be {allowed} (got {value!r})")
        return value

    return BeforeValidator(check)


def convert(fn: Callable[[Any], Any]) -> BeforeValidator:
    """A field conversion, run before the checks annotated ahead of it; ``fn`` may raise ConfigError."""
    return BeforeValidator(fn)


def is_count(low: int) -> Callable[[Any], bool]:
    """An integer (not a bool) >= ``low``."""
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low
