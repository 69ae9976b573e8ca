"""A Delta table as the sink sees it: opened or created, its schema checked, rows laid out in partitions, the
statistics an add action records, and the data files of checkpoints that never completed removed.

Everything here imports ``deltalake`` lazily (the ``sluice-etl[delta]`` extra)."""

from __future__ import annotations

import datetime
import json
import logging
import math
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from sluice.errors import ConfigError
from sluice.sinks.delta.options import DeltaSinkOptions, import_deltalake
from sluice.sinks.tables.errors import TableSchemaError
from sluice.sinks.tables.files import parse_data_file_name, split_by

if TYPE_CHECKING:
    from deltalake import DeltaTable

__all__ = [
    "DeltaLayout",
    "check_partitioning",
    "check_schema",
    "create_table",
    "delta_stats",
    "describe_schema",
    "open_table",
    "remove_orphans",
]

log = logging.getLogger("sluice.sinks.delta")

_PARTITION_TYPES = ("string", "long", "integer", "short", "byte", "date", "boolean")
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


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


def open_table(options: DeltaSinkOptions) -> DeltaTable | None:
    """The table, or None if there is none at the sink's path yet.

    Not ``DeltaTable.is_deltatable``: it keeps the GIL during its I/O, which stalls every other thread of the
    process meanwhile (and deadlocks with an S3 endpoint served by a thread of the same process)."""
    dl = import_deltalake()
    try:
        table: DeltaTable = dl.DeltaTable(options.path, storage_options=options.delta_storage_options())
    except dl.exceptions.TableNotFoundError:
        return None
    return table


def check_partitioning(options: DeltaSinkOptions, schema: pa.Schema) -> None:
    """Raise ConfigError unless every partition column is in ``schema`` with a type Delta can partition by."""
    missing = [c for c in options.partition_by if c not in schema.names]
    if missing:
        raise ConfigError(
            f"DeltaSink: partition_by names column(s) {missing} the stream does not have ({schema.names})"
        )
    for c in options.partition_by:
        if describe_schema(pa.schema([schema.field(c)]))[c] not in _PARTITION_TYPES:
            raise ConfigError(
                f"DeltaSink: partition column {c!r} has type {schema.field(c).type}; allowed: string, integers, date, boolean"
            )


def create_table(options: DeltaSinkOptions, schema: pa.Schema) -> DeltaTable:
    """Create the table (one place only: the driver; delta-rs does not guard concurrent creation)."""
    dl = import_deltalake()
    check_partitioning(options, schema)
    table: DeltaTable = dl.DeltaTable.create(
        options.path,
        schema,
        mode="ignore",
        partition_by=list(options.partition_by) or None,
        name=options.table_name,
        configuration=options.configuration or None,
        storage_options=options.delta_storage_options(),
    )
    return table


def check_schema(options: DeltaSinkOptions, table: DeltaTable, stream: pa.Schema) -> list[pa.Field]:
    """Raise TableSchemaError unless ``stream`` fits the table; return the stream's columns the table lacks
    (allowed only with ``schema_mode="merge"``)."""
    have = describe_schema(table.schema())
    want = describe_schema(stream)
    changed = {c: (have[c], t) for c, t in want.items() if c in have and have[c] != t}
    new = [stream.field(c) for c in want if c not in have]
    partitions = table.metadata().partition_columns
    if partitions != list(options.partition_by) and options.partition_by:
        raise TableSchemaError(
            f"DeltaSink {options.path}: the table is partitioned by {partitions}, the sink by {list(options.partition_by)}"
        )
    missing_partitions = [c for c in partitions if c not in want]
    if changed or missing_partitions or (new and options.schema_mode != "merge"):
        raise TableSchemaError(
            f"DeltaSink {options.path}: the stream's schema {_show(want)} does not fit the table's schema "
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


def remove_orphans(options: DeltaSinkOptions, job_id: str, app_id: str, restored_checkpoint_id: int | None) -> int:
    """Delete data files of ``job_id`` written for checkpoints that never completed; returns how many.

    Those are the job's files of checkpoints after both the restored one and the last one the table has
    (``transaction_version(app_id)``) that the table's current version does not reference. Files of the
    restored checkpoint and earlier are committed, or about to be by the restored checkpoint's re-commit.
    """
    table = open_table(options)
    if table is None:
        return 0
    active = set(pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist())
    upto = max(table.transaction_version(app_id) or 0, restored_checkpoint_id or 0)
    fs, root = options.filesystem()
    removed = 0
    for info in fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True)):
        rel = info.path[len(root) :].lstrip("/")
        parsed = parse_data_file_name(rel)
        if info.type != pafs.FileType.File or parsed is None or rel.startswith("_delta_log"):
            continue
        if (
            parsed[0] == job_id
            and parsed[1] > upto
            and rel not in active
            and quote(rel, safe="/=") not in active
        ):
            fs.delete_file(info.path)
            removed += 1
    if removed:
        log.info(
            "%s: deleted %d data file(s) of checkpoints of job %s that never completed",
            options.name,
            removed,
            job_id,
        )
    return removed
