"""JSON Schema (as registered in a schema registry) -> Arrow schema.

``integer`` -> int64, ``number`` -> double, ``string`` -> string (``format`` is kept as text), ``boolean``,
``null``, ``array`` with ``items`` -> list, ``object`` with ``properties`` -> struct (the top level must be
one: its properties are the columns). ``["null", T]``, ``oneOf``/``anyOf`` of null and one type, and
``["integer", "number"]`` are a nullable T / double. Local ``$ref`` (``#/definitions/..``, ``#/$defs/..``)
are followed. Objects without ``properties`` (free-form maps) and unions of different types have no Arrow
column type and raise :class:`~sluice.connectors.kafka.errors.UnsupportedSchemaError`.

Records are not validated against the JSON Schema (constraints such as ``minimum`` or ``pattern``); their
values must fit the column types, or they are bad records.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
from sluice.connectors.kafka.errors import UnsupportedSchemaError

__all__ = ["json_schema_to_arrow"]

_SCALARS: dict[str, pa.DataType] = {
    "integer": pa.int64(),
    "number": pa.float64(),
    "string": pa.string(),
    "boolean": pa.bool_(),
    "null": pa.null(),
}
_MAX_DEPTH = 32


def json_schema_to_arrow(text: str | dict[str, Any]) -> pa.Schema:
    """The Arrow schema of a JSON Schema whose top level is an object with ``properties``."""
    try:
        doc = json.loads(text) if isinstance(text, str) else text
    except ValueError as exc:
        raise UnsupportedSchemaError(f"not a JSON Schema document: {exc}") from None
    if not isinstance(doc, dict):
        raise UnsupportedSchemaError("a JSON Schema must be an object")
    top = _type(doc, doc, "", 0)
    if not pa.types.is_struct(top):
        raise UnsupportedSchemaError(
            f"records must be JSON objects with properties (the schema describes {top})"
        )
    return pa.schema(list(top))


def _resolve(node: dict[str, Any], doc: dict[str, Any], path: str) -> dict[str, Any]:
    ref = node.get("$ref")
    if ref is None:
        return node
    if not isinstance(ref, str) or not ref.startswith("#/"):
        raise UnsupportedSchemaError(
            f"{path or '<root>'}: only local $ref (#/...) are supported, not {ref!r}"
        )
    target: Any = doc
    for part in ref[2:].split("/"):
        if not isinstance(target, dict) or part not in target:
            raise UnsupportedSchemaError(f"{path or '<root>'}: $ref {ref!r} points nowhere")
        target = target[part]
    if not isinstance(target, dict):
        raise UnsupportedSchemaError(f"{path or '<root>'}: $ref {ref!r} is not a schema")
    return target


def _type(node: Any, doc: dict[str, Any], path: str, depth: int) -> pa.DataType:
    if depth > _MAX_DEPTH:
        raise UnsupportedSchemaError(f"{path}: nested deeper than {_MAX_DEPTH} levels (recursive $ref?)")
    if node is True or node == {}:
        raise UnsupportedSchemaError(f"{path or '<root>'}: any-typed values have no Arrow column type")
    if not isinstance(node, dict):
        raise UnsupportedSchemaError(f"{path or '<root>'}: not a schema: {node!r}")
    node = _resolve(node, doc, path)
    for key in ("oneOf", "anyOf"):
        if key in node:
            options = [o for o in node[key] if _resolve(o, doc, path).get("type") != "null"]
            if len(options) != 1:
                raise UnsupportedSchemaError(
                    f"{path or '<root>'}: {key} of several types has no Arrow column type (use one type, "
                    "optionally with null)"
                )
            return _type(options[0], doc, path, depth + 1)
    kind = node.get("type")
    if kind is None:
        if "properties" in node:
            kind = "object"
        elif "enum" in node or "const" in node:
            values = node.get("enum", [node.get("const")])
            kind = "string" if all(isinstance(v, str) for v in values) else None
        if kind is None:
            raise UnsupportedSchemaError(f"{path or '<root>'}: no type given")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        if sorted(kinds) == ["integer", "number"]:
            kinds = ["number"]
        if len(kinds) != 1:
            raise UnsupportedSchemaError(f"{path or '<root>'}: type {kind!r} mixes types; use one (and null)")
        kind = kinds[0] if kinds else "null"
    if kind in _SCALARS:
        return _SCALARS[kind]
    if kind == "array":
        items = node.get("items")
        if items is None:
            raise UnsupportedSchemaError(f"{path}: an array needs 'items' to have an Arrow type")
        return pa.list_(_type(items, doc, path + "[]", depth + 1))
    if kind == "object":
        props = node.get("properties")
        if not isinstance(props, dict) or not props:
            raise UnsupportedSchemaError(
                f"{path or '<root>'}: an object without properties (a free-form map) has no Arrow column type"
            )
        return pa.struct(
            [
                pa.field(name, _type(sub, doc, f"{path}.{name}" if path else name, depth + 1))
                for name, sub in props.items()
            ]
        )
    raise UnsupportedSchemaError(f"{path or '<root>'}: unknown type {kind!r}")
