"""Options of the built-in sources: frozen pydantic models (as :mod:`sluice.config`) and the source side.

A field is annotated with what it allows, and pydantic's own coercion is skipped (``SkipValidation``), so
a value is taken as given or refused with one line naming the option::

    batch_size: Annotated[int, SkipValidation, must("KafkaSource", "an integer >= 1", is_count(1))] = 100

refuses ``0`` with ``ConfigError("KafkaSource: batch_size must be an integer >= 1 (got 0)")``.

A source keeps its arguments as given and checks them into its model (:class:`OptionAttributes`): its
enumerator and readers get the model, never the source.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, BeforeValidator, ValidationInfo
from sluice.durations import Bare, Sign, to_ms, to_seconds
from sluice.errors import ConfigError

__all__ = ["OptionAttributes", "convert", "duration", "is_count", "must"]

M = TypeVar("M", bound=BaseModel)


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


def duration(owner: str, *, bare: Bare = "s", sign: Sign = "positive", none: bool = False) -> BeforeValidator:
    """A duration field (:mod:`sluice.durations`): ``"30 s"``, a timedelta, or a bare number in the unit its
    name ends with (``bare``: ``"s"`` gives float seconds, ``"ms"`` whole milliseconds); None passes when
    ``none``. Otherwise one ConfigError line naming the option and the allowed forms."""

    def check(value: Any, info: ValidationInfo) -> Any:
        if value is None and none:
            return None
        option = f"{owner}: {info.field_name}"
        if bare == "ms":
            return to_ms(value, option, sign=sign, bare="ms")
        return to_seconds(value, option, sign=sign, bare=bare)

    return BeforeValidator(check)


def is_count(low: int) -> Callable[[Any], bool]:
    """An integer (not a bool) >= ``low``."""
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low


class OptionAttributes(Generic[M]):
    """A source whose arguments are checked into the frozen model ``options_model`` (:attr:`options`).

    Each option reads as an attribute of the source (from the checked options); assigning one keeps the new
    value as given, checked when the options are next used (at the latest when the job is built).
    """

    #: the options model of the source
    options_model: ClassVar[type[BaseModel]]
    _given: dict[str, Any]
    _options: M | None

    def _take(self, given: dict[str, Any]) -> None:
        """Keep the arguments as given (``self`` excluded)."""
        object.__setattr__(self, "_given", {k: v for k, v in given.items() if k != "self"})
        object.__setattr__(self, "_options", None)

    @classmethod
    def _fields(cls) -> dict[str, str]:
        """argument name -> field of the model."""
        return {(f.alias or name): name for name, f in cls.options_model.model_fields.items()}

    @property
    def options(self) -> M:
        """The checked options (built on first use: ConfigError naming the option if one is wrong)."""
        if self._options is None:
            object.__setattr__(self, "_options", self.options_model(**self._given))
        assert self._options is not None
        return self._options

    def validate(self) -> None:
        """Check every option; raise ConfigError naming the option and what is allowed."""
        _ = self.options

    def __getattr__(self, name: str) -> Any:
        fields = type(self)._fields()
        if name.startswith("_") or name not in fields:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(self.options, fields[name])

    def __setattr__(self, name: str, value: Any) -> None:
        if name in type(self)._fields():
            self._given[name] = value
            object.__setattr__(self, "_options", None)
            if not hasattr(type(self), name):  # ``name`` is also a class attribute of every Source
                return
        object.__setattr__(self, name, value)
