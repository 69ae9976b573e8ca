"""The Iceberg catalog and table as the sink sees them: the catalog loaded from its properties (an embedded
SqlCatalog on SQLite by default), the table created if missing with its partition spec, the schema checked,
and the data files of checkpoints that never completed removed.

Everything here imports ``pyiceberg`` lazily (the ``sluice-etl[iceberg]`` extra)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.fs as pafs
from sluice.sinks.iceberg.layout import max_committed_checkpoint
from sluice.sinks.iceberg.options import IcebergSinkOptions
from sluice.sinks.iceberg.partitioning import parse_partition, partition_fields
from sluice.sinks.tables.errors import TableSchemaError
from sluice.sinks.tables.files import TableFile, parse_data_file_name
from sluice.sinks.tables.storage import arrow_filesystem

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

__all__ = ["check_schema", "check_spec", "load_catalog", "open_or_create", "remove_orphans"]

log = logging.getLogger("sluice.sinks.iceberg")


def check_spec(options: IcebergSinkOptions, table: Table) -> None:
    """TableSchemaError naming both specs unless the table is partitioned as ``options.partition_by`` says
    (an empty ``partition_by`` takes the table's spec)."""
    if not options.partition_by:
        return
    schema = table.schema()
    have = [(str(f.transform), schema.find_column_name(f.source_id) or "?") for f in table.spec().fields]
    want = [parse_partition(e) for e in options.partition_by]
    if have != want:
        raise TableSchemaError(
            f"IcebergSink {options.table}: the table is partitioned by {_spec(have)}, the sink by {_spec(want)}: "
            "give the sink the table's partition_by (or none, to take the table's), or write another table"
        )


def _spec(fields: list[tuple[str, str]]) -> str:
    return "[" + ", ".join(c if t == "identity" else f"{t}({c})" for t, c in fields) + "]"


def load_catalog(options: IcebergSinkOptions) -> Catalog:
    from pyiceberg.catalog import load_catalog as load

    return load(options.catalog, **options.catalog_config())


def open_or_create(options: IcebergSinkOptions, schema: pa.Schema | None) -> Table | None:
    """The table (created with ``schema`` and the sink's partition spec if missing; None if missing and no
    schema is given). Concurrent creators are safe: the catalog accepts one, the others load it."""
    from pyiceberg.catalog import Catalog as _Catalog
    from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError
    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.schema import assign_fresh_schema_ids

    catalog = load_catalog(options)
    try:
        return catalog.load_table(options.table)
    except NoSuchTableError:
        if schema is None:
            return None
    iceberg_schema = assign_fresh_schema_ids(_Catalog._convert_schema_if_needed(schema))
    fields = partition_fields(options.partition_by, iceberg_schema)  # checked before anything is created
    namespace = options.table.rsplit(".", 1)[0] if "." in options.table else None
    if namespace:
        try:
            catalog.create_namespace_if_not_exists(namespace)
        except Exception:  # another writer created it at the same moment
            if not catalog.namespace_exists(namespace):
                raise
    try:
        return catalog.create_table(
            options.table,
            schema=iceberg_schema,
            partition_spec=PartitionSpec(*fields),
            properties=options.table_properties,
        )
    except TableAlreadyExistsError:
        return catalog.load_table(options.table)


def check_schema(options: IcebergSinkOptions, table: Table, stream: pa.Schema) -> list[pa.Field]:
    """Raise TableSchemaError unless ``stream`` fits the table; return the stream's new columns (allowed with
    ``schema_mode="merge"``)."""
    from pyiceberg.catalog import Catalog as _Catalog

    have = {f.name: str(f.field_type) for f in table.schema().fields}
    want = {f.name: str(f.field_type) for f in _Catalog._convert_schema_if_needed(stream).fields}
    changed = {c: (have[c], t) for c, t in want.items() if c in have and have[c] != t}
    new = [stream.field(c) for c in want if c not in have]
    if changed or (new and options.schema_mode != "merge"):
        raise TableSchemaError(
            f"IcebergSink {options.table}: the stream's schema {_show(want)} does not fit the table's schema "
            f"{_show(have)}"
            + (f"; types differ: {changed}" if changed else "")
            + (f"; new columns {[f.name for f in new]} (set schema_mode='merge' to add them)" if new else "")
        )
    return new


def _show(types: dict[str, str]) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in types.items()) + "}"


def remove_orphans(options: IcebergSinkOptions, table: Table, job_id: str, committables: Sequence[TableFile]) -> int:
    """Delete data files of ``job_id`` that no completed checkpoint names: files of checkpoints after the last
    one the job committed (and after the restored one) that neither the restored checkpoint
    (``committables``) nor the current snapshot references. Returns how many."""
    location = table.location().rstrip("/")
    keep = {c.path for c in committables}
    keep |= {t.file.file_path[len(location) + 1 :] for t in table.scan().plan_files()}
    upto = max([max_committed_checkpoint(table, job_id, None), *(c.checkpoint_id for c in committables)])
    fs, root = arrow_filesystem(location, options.storage_options)
    removed = 0
    for info in fs.get_file_info(pafs.FileSelector(f"{root}/data", recursive=True, allow_not_found=True)):
        rel = info.path[len(root) :].lstrip("/")
        parsed = parse_data_file_name(rel)
        if (
            info.type == pafs.FileType.File
            and parsed is not None
            and parsed[0] == job_id
            and parsed[1] > upto
            and rel not in keep
        ):
            fs.delete_file(info.path)
            removed += 1
    if removed:
        log.info(
            "%s: recover deleted %d data file(s) of checkpoints of job %s that never completed",
            options.name,
            removed,
            job_id,
        )
    return removed
