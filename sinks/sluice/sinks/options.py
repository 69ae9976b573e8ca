"""What every built-in sink's options share: a frozen, validated model and sink attributes that read it.

A sink (``FileSink``, ``DeltaSink``, ``IcebergSink``) builds its :class:`SinkOptions` model from its
arguments, which checks them at once (``ConfigError`` naming the option and the allowed values, one line);
the sink itself is a thin SPI object, and its writers, committers and compactors receive the options, never
the sink. The model's checks run before pydantic's own type validation (:meth:`SinkOptions._check`), so
every message is the sink's own (``"FileSink: part_size must be ..."``), in the order the options are listed.

Each option is also an attribute of the sink (:class:`Option`). Assigning one replaces the model with an
unchecked copy; :meth:`SinkOptions.checked`, which ``Sink.validate`` calls when the job is built, checks it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, Protocol, TypeVar, overload

from pydantic import model_validator
from sluice.config import _Frozen
from sluice.errors import ConfigError

__all__ = ["RENAMED", "HasOptions", "Option", "SinkOptions", "int_at_least", "policy", "refuse_renamed"]

T = TypeVar("T")
M = TypeVar("M", bound="SinkOptions")


class SinkOptions(_Frozen):
    """Base of the sinks' options: frozen, no unknown option, checked by :meth:`check` on creation."""

    @model_validator(mode="before")
    @classmethod
    def _check(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        values = {
            name: f.get_default(call_default_factory=True) for name, f in cls.model_fields.items() if name not in data
        }
        values.update(data)
        return cls.check(values)

    @classmethod
    def of(cls: type[M], **raw: Any) -> M:
        """The options from a sink's arguments as given (``None`` for a default, a dict for a policy, ...);
        ConfigError naming the first wrong one."""
        return cls(**raw)

    @classmethod
    def check(cls, values: dict[str, Any]) -> dict[str, Any]:
        """Check and normalise the raw option values (every field present); raise ConfigError naming the
        first wrong option and the allowed values."""
        return values

    def checked(self: M) -> M:
        """These options checked again (after an :class:`Option` assignment)."""
        return type(self)(**{name: getattr(self, name) for name in type(self).model_fields})


class HasOptions(Protocol):
    """A sink holding its options model."""

    options: Any


class Option(Generic[T]):
    """A sink attribute that reads one field of the sink's ``options`` (``field``, else the attribute's own
    name); assigning it replaces ``options`` by an unchecked copy, checked when the job is built
    (``Sink.validate``)."""

    def __init__(self, field: str | None = None) -> None:
        self.field = field or ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.field = self.field or name

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> Option[T]: ...
    @overload
    def __get__(self, obj: HasOptions, objtype: type | None = None) -> T: ...
    def __get__(self, obj: HasOptions | None, objtype: type | None = None) -> Option[T] | T:
        if obj is None:
            return self
        value: T = getattr(obj.options, self.field)
        return value

    def __set__(self, obj: HasOptions, value: T) -> None:
        obj.options = obj.options.model_copy(update={self.field: value})


#: options of the sinks that were renamed, and their name now: one name for key columns across the sinks
#: (``PostgresSink`` and the Kafka change formats already said ``key_columns``)
RENAMED = {"keys": "key_columns", "key": "key_columns"}


def refuse_renamed(kind: str, given: Mapping[str, Any], strict: bool = True) -> None:
    """ConfigError naming the new name of an option of ``given`` that was renamed (:data:`RENAMED`); with
    ``strict`` (``given`` holds only arguments the sink does not take), a TypeError as Python's own for any
    other."""
    for old, value in given.items():
        if old in RENAMED:
            new = RENAMED[old]
            raise ConfigError(
                f"{kind}: {old}= is now {new}= (one name for the key columns of every sink): {new}={value!r}"
            )
    if given and strict:
        raise TypeError(f"{kind}() got an unexpected keyword argument {next(iter(given))!r}")


def int_at_least(kind: str, option: str, value: Any, low: int, what: str = "an integer") -> None:
    """ConfigError unless ``value`` is an int (not a bool) >= ``low``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{kind}: {option} must be {what} >= {low} (got {value!r})")


def policy(value: Any, cls: type[T], kind: str, option: str) -> T:
    """``value`` as a ``cls`` (a policy dataclass): an instance, or built from a dict of its options."""
    if isinstance(value, cls):
        return value
    if isinstance(value, dict):
        try:
            return cls(**value)
        except TypeError as exc:
            raise ConfigError(f"{kind}: {option}: {exc}") from None
    raise ConfigError(
        f"{kind}: {option} must be a {cls.__name__} or a dict of its options (got {type(value).__name__})"
    )
