"""The Iceberg catalog and table as the sink sees them: the catalog loaded from its properties (an embedded
SqlCatalog on SQLite by default), the table created if missing with its partition spec, the schema checked.

Everything here imports ``pyiceberg`` lazily (the ``sluice-etl[iceberg]`` extra)."""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from sluice.errors import ConfigError
from sluice.sinks.tables.errors import TableSchemaError
from sluice.sinks.tables.storage import iceberg_io_options, split_uri

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table
    from sluice.sinks.iceberg.sink import IcebergSink

__all__ = [
    "TRANSFORMS",
    "catalog_properties",
    "check_schema",
    "check_spec",
    "import_pyiceberg",
    "load_catalog",
    "open_or_create",
    "parse_partition",
    "partition_fields",
]

#: partition transforms ``partition_by`` accepts: ``"col"`` (identity) or ``"<transform>(col)"``
TRANSFORMS = ("identity", "year", "month", "day", "hour")
#: the Iceberg types each transform takes (identity: any primitive type)
_TAKES = {
    "identity": "any primitive type",
    "year": "date, timestamp, timestamptz",
    "month": "date, timestamp, timestamptz",
    "day": "date, timestamp, timestamptz",
    "hour": "timestamp, timestamptz",
}
_SPEC = re.compile(r"^(?:(?P<t>[a-z]+)\((?P<c>[^()]+)\)|(?P<plain>[^()]+))$")


def import_pyiceberg() -> Any:
    """The ``pyiceberg`` module, or a ConfigError naming the extra that installs it."""
    try:
        import pyiceberg.catalog
        import pyiceberg.io.pyarrow
        import pyiceberg.transforms
    except ImportError as exc:
        raise ConfigError(
            f"IcebergSink needs the pyiceberg package: pip install 'sluice-etl[iceberg]' ({exc})"
        ) from None
    return pyiceberg


def parse_partition(entry: str) -> tuple[str, str]:
    """``(transform, column)`` of a ``partition_by`` entry; ConfigError naming the allowed transforms."""
    m = _SPEC.match(entry.strip()) if isinstance(entry, str) else None
    transform, column = (
        (m.group("t") or "identity", (m.group("c") or m.group("plain")).strip()) if m else ("", "")
    )
    if not m or transform not in TRANSFORMS:
        raise ConfigError(
            f"IcebergSink: partition_by entry {entry!r} must be a column or one of "
            f"{', '.join(t + '(col)' for t in TRANSFORMS)}"
        )
    return transform, column


def partition_fields(sink: IcebergSink, schema: Any) -> list[Any]:
    """The PartitionFields of ``sink.partition_by`` over ``schema`` (an Iceberg or Arrow schema); ConfigError
    naming the entry if its column is missing or its transform cannot take the column's type."""
    from pyiceberg.catalog import Catalog as _Catalog
    from pyiceberg.partitioning import PartitionField
    from pyiceberg.transforms import parse_transform

    if isinstance(schema, pa.Schema):
        try:
            schema = _Catalog._convert_schema_if_needed(schema)
        except Exception as exc:  # pyiceberg names the type it cannot store
            raise ConfigError(f"IcebergSink: the stream's schema has no Iceberg equivalent: {exc}") from None
    fields = []
    for i, entry in enumerate(sink.partition_by):
        transform, column = parse_partition(entry)
        try:
            source = schema.find_field(column)
        except ValueError:
            raise ConfigError(
                f"IcebergSink: partition_by column {column!r} is not in the stream ({schema.column_names})"
            ) from None
        t = parse_transform(transform)
        if not t.can_transform(source.field_type):
            raise ConfigError(
                f"IcebergSink: partition_by {entry!r}: column {column!r} has type {source.field_type}, "
                f"which {transform} cannot take ({transform} takes {_TAKES[transform]}); cast the column "
                "upstream or choose another transform"
            )
        name = column if transform == "identity" else f"{column}_{transform}"
        fields.append(PartitionField(source.field_id, 1000 + i, t, name))
    return fields


def check_spec(sink: IcebergSink, table: Table) -> None:
    """TableSchemaError naming both specs unless the table is partitioned as ``sink.partition_by`` says
    (an empty ``partition_by`` takes the table's spec)."""
    if not sink.partition_by:
        return
    schema = table.schema()
    have = [(str(f.transform), schema.find_column_name(f.source_id) or "?") for f in table.spec().fields]
    want = [parse_partition(e) for e in sink.partition_by]
    if have != want:
        raise TableSchemaError(
            f"IcebergSink {sink.table}: the table is partitioned by {_spec(have)}, the sink by {_spec(want)}: "
            "give the sink the table's partition_by (or none, to take the table's), or write another table"
        )


def _spec(fields: list[tuple[str, str]]) -> str:
    return "[" + ", ".join(c if t == "identity" else f"{t}({c})" for t, c in fields) + "]"


def catalog_properties(sink: IcebergSink) -> dict[str, str]:
    """The catalog's properties: the sink's, the embedded SqlCatalog's defaults, FileIO storage options."""
    props = {k: str(v) for k, v in sink.catalog_properties.items()}
    if sink.warehouse is not None:
        props.setdefault("warehouse", sink.warehouse)
    if "type" not in props and "uri" not in props:
        warehouse = props.get("warehouse")
        if warehouse is None or split_uri(warehouse)[0] != "file":
            raise ConfigError(
                "IcebergSink: give catalog_properties a 'uri' (e.g. sqlite:////path/catalog.db for the embedded "
                "SqlCatalog, or a REST/Glue/Hive catalog's settings), or a local warehouse folder"
            )
        root = split_uri(warehouse)[1]
        os.makedirs(root, exist_ok=True)
        props["uri"] = f"sqlite:///{root}/catalog.db"
        props["warehouse"] = f"file://{root}"
    if "type" not in props and props.get("uri", "").startswith(("sqlite:", "postgresql:", "mysql:")):
        props["type"] = "sql"
    if props.get("uri", "").startswith("sqlite:///"):
        os.makedirs(os.path.dirname(props["uri"].removeprefix("sqlite:///")) or ".", exist_ok=True)
    props.update(iceberg_io_options(sink.storage_options))
    return props


def load_catalog(sink: IcebergSink) -> Catalog:
    from pyiceberg.catalog import load_catalog as load

    return load(sink.catalog, **catalog_properties(sink))


def open_or_create(sink: IcebergSink, schema: pa.Schema | None) -> Table | None:
    """The table (created with ``schema`` and the sink's partition spec if missing; None if missing and no
    schema is given). Concurrent creators are safe: the catalog accepts one, the others load it."""
    from pyiceberg.catalog import Catalog as _Catalog
    from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError
    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.schema import assign_fresh_schema_ids

    catalog = load_catalog(sink)
    try:
        return catalog.load_table(sink.table)
    except NoSuchTableError:
        if schema is None:
            return None
    iceberg_schema = assign_fresh_schema_ids(_Catalog._convert_schema_if_needed(schema))
    fields = partition_fields(sink, iceberg_schema)  # checked before anything is created
    namespace = sink.table.rsplit(".", 1)[0] if "." in sink.table else None
    if namespace:
        try:
            catalog.create_namespace_if_not_exists(namespace)
        except Exception:  # another writer created it at the same moment
            if not catalog.namespace_exists(namespace):
                raise
    try:
        return catalog.create_table(
            sink.table,
            schema=iceberg_schema,
            partition_spec=PartitionSpec(*fields),
            properties=sink.table_properties,
        )
    except TableAlreadyExistsError:
        return catalog.load_table(sink.table)


def check_schema(sink: IcebergSink, table: Table, stream: pa.Schema) -> list[pa.Field]:
    """Raise TableSchemaError unless ``stream`` fits the table; return the stream's new columns (allowed with
    ``schema_mode="merge"``)."""
    from pyiceberg.catalog import Catalog as _Catalog

    have = {f.name: str(f.field_type) for f in table.schema().fields}
    want = {f.name: str(f.field_type) for f in _Catalog._convert_schema_if_needed(stream).fields}
    changed = {c: (have[c], t) for c, t in want.items() if c in have and have[c] != t}
    new = [stream.field(c) for c in want if c not in have]
    if changed or (new and sink.schema_mode != "merge"):
        raise TableSchemaError(
            f"IcebergSink {sink.table}: the stream's schema {_show(want)} does not fit the table's schema "
            f"{_show(have)}"
            + (f"; types differ: {changed}" if changed else "")
            + (f"; new columns {[f.name for f in new]} (set schema_mode='merge' to add them)" if new else "")
        )
    return new


def _show(types: dict[str, str]) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in types.items()) + "}"
