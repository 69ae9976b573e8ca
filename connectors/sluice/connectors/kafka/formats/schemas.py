"""Steady Arrow schemas: widen compatible types instead of failing, align batches to one schema.

A stream's schema may only *widen*: a later value may be wider than what came before (an int field gets a
``1.5``, a field seen only as null gets a value, an object gets a new field), and the stream's schema grows
to hold both. Everything else (a number field gets a string, a list becomes an object) is an
:class:`~sluice.connectors.kafka.errors.IncompatibleSchemaError` naming the field and both types.
"""

from __future__ import annotations

import pyarrow as pa
from sluice.connectors.kafka.errors import IncompatibleSchemaError

__all__ = ["align", "widen", "widen_type"]


def _is_int(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t))


def _is_float(t: pa.DataType) -> bool:
    return bool(pa.types.is_floating(t))


def widen_type(old: pa.DataType, new: pa.DataType, path: str) -> pa.DataType:
    """The narrowest type holding values of ``old`` and ``new``; IncompatibleSchemaError naming ``path``."""
    if old == new:
        return old
    if pa.types.is_null(old):
        return new
    if pa.types.is_null(new):
        return old
    if _is_int(old) and _is_int(new):
        return pa.int64()
    if (_is_int(old) or _is_float(old)) and (_is_int(new) or _is_float(new)):
        return pa.float64()
    if pa.types.is_timestamp(old) and pa.types.is_timestamp(new) and old.tz == new.tz:
        return old if "smun".index(old.unit[0]) >= "smun".index(new.unit[0]) else new
    temporal = (pa.types.is_timestamp, pa.types.is_date)
    if pa.types.is_string(old) and any(f(new) for f in temporal):
        return old
    if pa.types.is_string(new) and any(f(old) for f in temporal):
        return new
    if pa.types.is_struct(old) and pa.types.is_struct(new):
        return pa.struct(_widen_fields(list(old), list(new), path + "."))
    if pa.types.is_list(old) and pa.types.is_list(new):
        return pa.list_(widen_type(old.value_type, new.value_type, path + "[]"))
    raise IncompatibleSchemaError(path or "<value>", old, new)


def _widen_fields(old: list[pa.Field], new: list[pa.Field], prefix: str) -> list[pa.Field]:
    by_name = {f.name: f for f in new}
    out = [
        pa.field(f.name, widen_type(f.type, by_name[f.name].type, prefix + f.name))
        if f.name in by_name
        else f
        for f in old
    ]
    known = {f.name for f in old}
    out.extend(f for f in new if f.name not in known)
    return out


def widen(old: pa.Schema | None, new: pa.Schema) -> pa.Schema:
    """``old`` widened to hold ``new`` (fields of ``old`` first, then new ones in ``new``'s order)."""
    if old is None:
        return new
    if old.equals(new):
        return old
    return pa.schema(_widen_fields(list(old), list(new), ""))


def _align_array(arr: pa.Array, typ: pa.DataType) -> pa.Array:
    if arr.type == typ:
        return arr
    if pa.types.is_struct(typ) and pa.types.is_struct(arr.type):
        names = {arr.type.field(i).name: i for i in range(arr.type.num_fields)}
        children = [
            _align_array(arr.field(names[f.name]), f.type) if f.name in names else pa.nulls(len(arr), f.type)
            for f in typ
        ]
        return pa.StructArray.from_arrays(children, fields=list(typ), mask=arr.is_null())
    if pa.types.is_list(typ) and pa.types.is_list(arr.type) and not arr.type.value_type == typ.value_type:
        values = _align_array(arr.values, typ.value_type)
        return pa.ListArray.from_arrays(arr.offsets, values, type=typ, mask=arr.is_null())
    return arr.cast(typ)


def align(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` with exactly ``schema``'s columns: cast (widened), missing ones null, unknown ones dropped."""
    if batch.schema.equals(schema):
        return batch
    names = set(batch.schema.names)
    columns = [
        _align_array(batch.column(f.name), f.type) if f.name in names else pa.nulls(batch.num_rows, f.type)
        for f in schema
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)
