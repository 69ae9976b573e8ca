"""Avro message values into Arrow: plain (one writer schema) or Confluent wire format (schema ids).

Avro -> Arrow types: null, boolean, int (int32), long (int64), float, double, bytes (binary), string, enum
(string), fixed (fixed_size_binary), record (struct), array (list), map (map<string, _>), ``[null, T]``
(nullable T); logical types timestamp-millis/micros/nanos (timestamp UTC), local-timestamp-* (timestamp),
date, time-millis/micros, decimal (decimal128/256), uuid (string). Unions of two or more non-null types
have no Arrow counterpart here: their schema is refused (a ConfigError for ``avro_schema``, bad records
for a registry id).

Records whose writer schema is the reader schema are decoded column by column (:mod:`.avro_columnar`);
others -- older schema ids resolved to the newest one, or schemas with arrays, maps or decimals -- go
record by record through fastavro's ``schemaless_reader`` (its C extension), which applies Avro's schema
resolution (defaults, promotions, aliases) and raises for incompatible changes. Timestamps, dates and
times are read as plain integers and cast in Arrow, which is faster than building Python datetimes.
"""

from __future__ import annotations

import io
import json
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa
from sluice.connectors.kafka.errors import UnsupportedSchemaError
from sluice.connectors.kafka.formats.avro_columnar import compile_plan
from sluice.errors import ConfigError

__all__ = ["AvroSchema", "columnar_or_none", "read_records"]

#: logical types read as their physical type and cast in Arrow: (physical Avro type, Arrow type)
_CAST_LOGICAL: dict[str, pa.DataType] = {
    "timestamp-millis": pa.timestamp("ms", tz="UTC"),
    "timestamp-micros": pa.timestamp("us", tz="UTC"),
    "timestamp-nanos": pa.timestamp("ns", tz="UTC"),
    "local-timestamp-millis": pa.timestamp("ms"),
    "local-timestamp-micros": pa.timestamp("us"),
    "local-timestamp-nanos": pa.timestamp("ns"),
    "date": pa.date32(),
    "time-millis": pa.time32("ms"),
    "time-micros": pa.time64("us"),
    "uuid": pa.string(),
}
_PRIMITIVE: dict[str, pa.DataType] = {
    "null": pa.null(),
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "bytes": pa.binary(),
    "string": pa.string(),
}


def _strip(schema: Any) -> Any:
    """``schema`` without the logical types that are cast in Arrow (their physical type remains)."""
    if isinstance(schema, list):
        return [_strip(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    if schema.get("logicalType") in _CAST_LOGICAL and isinstance(schema.get("type"), str):
        return schema["type"]
    out = dict(schema)
    if "fields" in out:
        out["fields"] = [{**f, "type": _strip(f["type"])} for f in out["fields"]]
    for key in ("items", "values"):
        if key in out:
            out[key] = _strip(out[key])
    if isinstance(out.get("type"), dict | list):
        out["type"] = _strip(out["type"])
    return out


def _arrow_type(schema: Any, where: str) -> pa.DataType:
    """Arrow type of an expanded (named types inlined) Avro schema."""
    if isinstance(schema, str):
        if schema in _PRIMITIVE:
            return _PRIMITIVE[schema]
        raise UnsupportedSchemaError(f"{where}: unknown type {schema!r}")
    if isinstance(schema, list):
        branches = [s for s in schema if s != "null"]
        if len(branches) > 1:
            raise UnsupportedSchemaError(
                f"{where}: a union of several non-null types {schema!r} has no Arrow column type; use "
                '["null", T] or one record type'
            )
        return _arrow_type(branches[0], where) if branches else pa.null()
    kind = schema.get("type")
    logical = schema.get("logicalType")
    if logical in _CAST_LOGICAL and isinstance(kind, str):
        return _CAST_LOGICAL[logical]
    if logical == "decimal" and kind in ("bytes", "fixed"):
        precision, scale = int(schema["precision"]), int(schema.get("scale", 0))
        return pa.decimal128(precision, scale) if precision <= 38 else pa.decimal256(precision, scale)
    if kind == "record":
        return pa.struct(
            [pa.field(f["name"], _arrow_type(f["type"], f"{where}.{f['name']}")) for f in schema["fields"]]
        )
    if kind == "enum":
        return pa.string()
    if kind == "fixed":
        return pa.binary(int(schema["size"]))
    if kind == "array":
        return pa.list_(_arrow_type(schema["items"], f"{where}[]"))
    if kind == "map":
        return pa.map_(pa.string(), _arrow_type(schema["values"], f"{where}{{}}"))
    return _arrow_type(kind, where)


class AvroSchema:
    """One Avro schema, compiled for decoding.

    Attributes:
        schema_id: the registry id (None for a schema given as an option).
        parsed: fastavro's parsed form, without the logical types cast in Arrow.
        physical: the Arrow schema the records decode into.
        logical: the Arrow schema they are cast to (timestamps, dates, times).
        key: identity of the schema (two ids of one schema decode the same way).
        text: the schema as JSON text, logical types included (for the native decoder).
        record: whether the top-level type is a record (else the value becomes one column ``value``).
    """

    def __init__(
        self, text_or_schema: str | dict[str, Any] | list[Any], schema_id: int | None = None
    ) -> None:
        self.schema_id = schema_id
        try:
            raw = json.loads(text_or_schema) if isinstance(text_or_schema, str) else text_or_schema
            stripped = _strip(raw)
            self.parsed = fastavro.parse_schema(stripped)
            expanded_raw = fastavro.parse_schema(raw, expand=True)
            expanded = fastavro.parse_schema(stripped, expand=True)
        except (ValueError, TypeError, KeyError, RecursionError, fastavro.schema.SchemaParseException) as exc:
            raise UnsupportedSchemaError(f"not a valid Avro schema: {exc}") from None
        self.record = isinstance(expanded, dict) and expanded.get("type") == "record"
        where = self.label
        if self.record:
            self.logical = pa.schema(list(_arrow_type(expanded_raw, where)))
            self.physical = pa.schema(list(_arrow_type(expanded, where)))
        else:
            self.logical = pa.schema([("value", _arrow_type(expanded_raw, where))])
            self.physical = pa.schema([("value", _arrow_type(expanded, where))])
        self.plan = compile_plan(expanded) if self.record else None
        self.key = json.dumps(stripped, sort_keys=True)
        self.text = text_or_schema if isinstance(text_or_schema, str) else json.dumps(raw)

    @property
    def label(self) -> str:
        return f"schema id {self.schema_id}" if self.schema_id is not None else "avro_schema"

    @classmethod
    def option(cls, value: Any) -> AvroSchema:
        """Compile the ``avro_schema`` option; ConfigError if it is not a usable schema."""
        try:
            return cls(value)
        except UnsupportedSchemaError as exc:
            raise ConfigError(f"KafkaSource: avro_schema: {exc}") from None


def read_records(
    payloads: list[bytes], writer: AvroSchema, reader: AvroSchema
) -> tuple[pa.RecordBatch, list[int], list[tuple[int, str]]]:
    """Decode ``payloads`` one by one with fastavro (resolving ``writer`` to ``reader``).

    Returns:
        The decoded rows (``reader.physical``), the indices of the payloads they came from, and
        ``(index, error)`` of each payload that could not be decoded.
    """
    read = fastavro.schemaless_reader
    w = writer.parsed
    r = None if writer.key == reader.key else reader.parsed
    records: list[Any] = []
    good: list[int] = []
    bad: list[tuple[int, str]] = []
    for i, payload in enumerate(payloads):
        fo = io.BytesIO(payload)
        try:
            rec = read(fo, w, r)
        except Exception as exc:
            bad.append((i, _read_error(exc, writer, reader)))
            continue
        left = len(payload) - fo.tell()
        if left:
            bad.append((i, f"{left} byte(s) left after the record: not written with {writer.label}?"))
            continue
        records.append(rec if reader.record else {"value": rec})
        good.append(i)
    try:
        batch = pa.RecordBatch.from_pylist(records, schema=reader.physical)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        batch, good, more = _rows_one_by_one(records, good, reader.physical)
        bad = sorted(bad + more)
    return batch, good, bad


def _rows_one_by_one(
    records: list[Any], good: list[int], schema: pa.Schema
) -> tuple[pa.RecordBatch, list[int], list[tuple[int, str]]]:
    keep: list[Any] = []
    kept: list[int] = []
    bad: list[tuple[int, str]] = []
    for rec, i in zip(records, good, strict=True):
        try:
            pa.RecordBatch.from_pylist([rec], schema=schema)
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
            bad.append((i, f"value does not fit the Arrow column type: {exc}"))
            continue
        keep.append(rec)
        kept.append(i)
    return pa.RecordBatch.from_pylist(keep, schema=schema), kept, bad


def _read_error(exc: Exception, writer: AvroSchema, reader: AvroSchema) -> str:
    if isinstance(exc, fastavro.read.SchemaResolutionError):
        return (
            f"{writer.label} cannot be read as {reader.label} (incompatible schema change): {exc}. Register "
            "only compatible versions (BACKWARD), or give avro_schema as the reader schema"
        )
    if isinstance(exc, EOFError):
        return f"truncated Avro record for {writer.label}: its bytes end inside a field ({exc or 'EOF'})"
    return f"invalid Avro record for {writer.label}: {type(exc).__name__}: {exc}".strip()


def columnar_or_none(
    writer: AvroSchema, reader: AvroSchema, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> tuple[pa.RecordBatch, np.ndarray] | None:
    """Columnar decode when ``writer`` is ``reader`` and has a plan: (batch of every row, bad-row mask)."""
    if writer.key != reader.key or reader.plan is None:
        return None
    arr, bad = reader.plan.decode(buf, starts, ends)
    return pa.RecordBatch.from_struct_array(arr), bad
