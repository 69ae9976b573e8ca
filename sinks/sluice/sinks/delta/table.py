"""A Delta table as the sink sees it: opened or created, its schema checked, rows laid out in partitions, and
the statistics an add action records.

Everything here imports ``deltalake`` lazily (the ``sluice-etl[delta]`` extra)."""

from __future__ import annotations

import datetime
import json
import math
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute as pc
from sluice.errors import ConfigError
from sluice.sinks.tables.errors import TableSchemaError
from sluice.sinks.tables.files import split_by

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from sluice.sinks.delta.sink import DeltaSink

__all__ = [
    "DeltaLayout",
    "check_partitioning",
    "check_schema",
    "create_table",
    "delta_stats",
    "describe_schema",
    "import_deltalake",
    "open_table",
]

_PARTITION_TYPES = ("string", "long", "integer", "short", "byte", "date", "boolean")
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


def import_deltalake() -> Any:
    """The ``deltalake`` module, or a ConfigError naming the extra that installs it."""
    try:
        import deltalake
    except ImportError as exc:
        raise ConfigError(
            f"DeltaSink needs the deltalake package: pip install 'sluice-etl[delta]' ({exc})"
        ) from None
    return deltalake


def describe_schema(schema: Any) -> dict[str, str]:
    """``{column: Delta type}`` of a Delta schema or an Arrow schema."""
    from deltalake.schema import Schema

    if isinstance(schema, pa.Schema):
        schema = Schema.from_arrow(schema)
    return {f.name: _type_name(f.type) for f in schema.fields}


def _type_name(t: Any) -> str:
    from deltalake.schema import PrimitiveType

    return str(t.type) if isinstance(t, PrimitiveType) else str(t.to_json())


def _show(types: dict[str, str]) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in types.items()) + "}"


def open_table(sink: DeltaSink) -> DeltaTable | None:
    """The table, or None if there is none at the sink's path yet.

    Not ``DeltaTable.is_deltatable``: it keeps the GIL during its I/O, which stalls every other thread of the
    process meanwhile (and deadlocks with an S3 endpoint served by a thread of the same process)."""
    dl = import_deltalake()
    try:
        table: DeltaTable = dl.DeltaTable(sink.path, storage_options=sink.delta_storage_options())
    except dl.exceptions.TableNotFoundError:
        return None
    return table


def check_partitioning(sink: DeltaSink, schema: pa.Schema) -> None:
    """Raise ConfigError unless every partition column is in ``schema`` with a type Delta can partition by."""
    missing = [c for c in sink.partition_by if c not in schema.names]
    if missing:
        raise ConfigError(
            f"DeltaSink: partition_by names column(s) {missing} the stream does not have ({schema.names})"
        )
    for c in sink.partition_by:
        if describe_schema(pa.schema([schema.field(c)]))[c] not in _PARTITION_TYPES:
            raise ConfigError(
                f"DeltaSink: partition column {c!r} has type {schema.field(c).type}; allowed: string, integers, date, boolean"
            )


def create_table(sink: DeltaSink, schema: pa.Schema) -> DeltaTable:
    """Create the table (one place only: the driver; delta-rs does not guard concurrent creation)."""
    dl = import_deltalake()
    check_partitioning(sink, schema)
    table: DeltaTable = dl.DeltaTable.create(
        sink.path,
        schema,
        mode="ignore",
        partition_by=list(sink.partition_by) or None,
        name=sink.table_name,
        configuration=sink.configuration or None,
        storage_options=sink.delta_storage_options(),
    )
    return table


def check_schema(sink: DeltaSink, table: DeltaTable, stream: pa.Schema) -> list[pa.Field]:
    """Raise TableSchemaError unless ``stream`` fits the table; return the stream's columns the table lacks
    (allowed only with ``schema_mode="merge"``)."""
    have = describe_schema(table.schema())
    want = describe_schema(stream)
    changed = {c: (have[c], t) for c, t in want.items() if c in have and have[c] != t}
    new = [stream.field(c) for c in want if c not in have]
    partitions = table.metadata().partition_columns
    if partitions != list(sink.partition_by) and sink.partition_by:
        raise TableSchemaError(
            f"DeltaSink {sink.path}: the table is partitioned by {partitions}, the sink by {list(sink.partition_by)}"
        )
    missing_partitions = [c for c in partitions if c not in want]
    if changed or missing_partitions or (new and sink.schema_mode != "merge"):
        raise TableSchemaError(
            f"DeltaSink {sink.path}: the stream's schema {_show(want)} does not fit the table's schema "
            f"{_show(have)}"
            + (f"; types differ: {changed}" if changed else "")
            + (f"; new columns {[f.name for f in new]} (set schema_mode='merge' to add them)" if new else "")
            + (f"; partition columns missing: {missing_partitions}" if missing_partitions else "")
        )
    return new


class DeltaLayout:
    """Rows of one stream schema as files of the table: split by partition, partition columns dropped (Delta
    keeps them in the log), the rest cast to the table's types (missing columns become nulls)."""

    def __init__(self, table_schema: pa.Schema, partition_by: list[str]) -> None:
        self.partition_by = partition_by
        self.data_schema = pa.schema([f for f in table_schema if f.name not in partition_by])
        self.partition_schema = pa.schema([table_schema.field(c) for c in partition_by])

    def partitions(self, table: pa.Table) -> list[tuple[tuple[tuple[str, Any], ...], str, pa.Table]]:
        out = []
        for values, rows in split_by(table, [table.column(c) for c in self.partition_by]):
            strings = tuple(_partition_string(v) for v in values)
            path = "/".join(
                f"{c}={quote(s if s is not None else HIVE_NULL, safe='')}"
                for c, s in zip(self.partition_by, strings, strict=True)
            )
            out.append((tuple(zip(self.partition_by, strings, strict=True)), path, self._as_stored(rows)))
        return out

    def _as_stored(self, rows: pa.Table) -> pa.Table:
        cols = []
        for f in self.data_schema:
            col = rows.column(f.name) if f.name in rows.column_names else pa.nulls(rows.num_rows, f.type)
            cols.append(col.cast(f.type) if col.type != f.type else col)
        return pa.Table.from_arrays(cols, schema=self.data_schema)


def _partition_string(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, datetime.date):
        return v.isoformat()
    return str(v)


def delta_stats(table: pa.Table) -> str:
    """The add action's ``stats`` JSON: numRecords and, per primitive column, min, max and null count."""
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for name, col in zip(table.column_names, table.columns, strict=True):
        t = col.type
        if not (
            pa.types.is_integer(t)
            or pa.types.is_floating(t)
            or pa.types.is_string(t)
            or pa.types.is_large_string(t)
            or pa.types.is_date(t)
            or pa.types.is_timestamp(t)
            or pa.types.is_boolean(t)
        ):
            continue
        nulls[name] = col.null_count
        if col.null_count == len(col) or pa.types.is_boolean(t) or pa.types.is_timestamp(t):
            continue  # Delta keeps timestamp bounds in milliseconds: a truncated max would be wrong
        mm = pc.min_max(col)
        lo, hi = _json_value(mm["min"].as_py()), _json_value(mm["max"].as_py())
        if lo is not None and hi is not None:
            mins[name], maxs[name] = lo, hi
    return json.dumps(
        {"numRecords": table.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}
    )


def _json_value(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, str):
        return v if len(v) <= 32 else None  # a truncated max would be wrong: no bound rather than a false one
    if isinstance(v, datetime.date):
        return v.isoformat()
    return v
