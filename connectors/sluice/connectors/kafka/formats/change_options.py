"""The ``format_options`` of the change formats (Debezium, keyed upsert): frozen models, checked at build time.

A wrong value raises one ConfigError line naming the option and what is allowed, e.g.
``KafkaSource: format_options['tombstones'] must be 'delete' or 'skip' (got 'drop')``; an unknown option
names the options the format takes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar

from pydantic import SkipValidation
from sluice.config import _Frozen
from sluice.connectors.options import convert, must
from sluice.errors import ConfigError

__all__ = ["DebeziumOptions", "UpsertOptions", "change_options"]

M = TypeVar("M", bound=_Frozen)


def _opt(name: str, allowed: str, ok: Any) -> Any:
    return must("KafkaSource", allowed, ok, f"format_options[{name!r}]")


def _is_name(v: Any) -> bool:
    return isinstance(v, str) and bool(v)


def _names(v: Any) -> Any:
    return [v] if isinstance(v, str) else list(v) if isinstance(v, tuple) else v


def _is_names(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(_is_name(n) for n in v) and len(set(v)) == len(v)


class DebeziumOptions(_Frozen):
    """``format_options`` of ``debezium-json`` and ``debezium-avro``.

    Attributes:
        key_columns: the key columns, taken from the row (``after``; ``before`` for a delete). None: the
            fields of the message key (the table's primary key, which Debezium writes there).
        tombstones: ``"delete"``: a null value deletes the row its message key names (what a compacted topic
            keeps of a delete); ``"skip"``: null values are skipped and counted (the delete event before
            each tombstone carries the delete).
        source_fields: fields of the event's ``source`` block to add as columns ``_source_<field>``.
        ts_ms: add the event's ``ts_ms`` (when the connector processed it) as column ``_ts_ms``.
    """

    key_columns: Annotated[
        list[str] | None,
        SkipValidation,
        _opt("key_columns", "a column name, a list of distinct names or None", lambda v: v is None or _is_names(v)),
        convert(_names),
    ] = None
    tombstones: Annotated[
        Literal["delete", "skip"], SkipValidation, _opt("tombstones", "'delete' or 'skip'", lambda v: v in ("delete", "skip"))
    ] = "delete"
    source_fields: Annotated[
        list[str],
        SkipValidation,
        _opt("source_fields", "a list of field names of the source block", lambda v: v == [] or _is_names(v)),
        convert(_names),
    ] = []
    ts_ms: Annotated[bool, SkipValidation, _opt("ts_ms", "True or False", lambda v: isinstance(v, bool))] = False


KEY_FORMATS = ("json", "string", "avro")


class UpsertOptions(_Frozen):
    """``format_options`` of ``upsert-json`` and ``upsert-avro``.

    Attributes:
        key_column: the column of a scalar key (a JSON number or string, a string key, an Avro primitive);
            None: the key is an object (JSON) or record (Avro) whose fields are the key columns.
        key_format: how keys are written: ``"json"``, ``"string"`` (UTF-8 text: needs ``key_column``) or
            ``"avro"`` (Confluent wire format: needs ``schema_registry``); default: the value's format.
    """

    key_column: Annotated[
        str | None, SkipValidation, _opt("key_column", "a column name or None", lambda v: v is None or _is_name(v))
    ] = None
    key_format: Annotated[
        Literal["json", "string", "avro"] | None,
        SkipValidation,
        _opt("key_format", f"one of {KEY_FORMATS} or None", lambda v: v is None or v in KEY_FORMATS),
    ] = None


def change_options(model: type[M], given: Mapping[str, Any] | None, format_name: str) -> M:
    """``given`` checked into ``model``; ConfigError naming an unknown option and the ones there are."""
    given = dict(given or {})
    unknown = sorted(set(given) - set(model.model_fields))
    if unknown:
        raise ConfigError(
            f"KafkaSource: format_options of format {format_name!r} are {tuple(model.model_fields)} "
            f"(got {unknown[0]!r})"
        )
    return model(**given)
