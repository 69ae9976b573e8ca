"""``IcebergSink``: exactly-once into an Apache Iceberg table, one snapshot per checkpoint (pyiceberg)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from sluice.errors import ConfigError, StorageError
from sluice.sink import GlobalCommitter, GlobalCommitterContext
from sluice.sinks.iceberg.catalog import (
    check_schema,
    check_spec,
    load_catalog,
    open_or_create,
    remove_orphans,
)
from sluice.sinks.iceberg.committer import IcebergCommitter
from sluice.sinks.iceberg.format import IcebergFormat
from sluice.sinks.iceberg.layout import max_committed_checkpoint
from sluice.sinks.iceberg.options import IcebergSinkOptions
from sluice.sinks.iceberg.partitioning import parse_partition, partition_fields
from sluice.sinks.iceberg.upsert_sink import staging_storage, upsert_committer
from sluice.sinks.options import Option, refuse_renamed
from sluice.sinks.tables.change_writer import Storage
from sluice.sinks.tables.files import TableFile
from sluice.sinks.tables.rewrite import RewritePolicy
from sluice.sinks.tables.sink import TableSink
from sluice.sinks.tables.storage import probe_location
from sluice.sinks.tables.writer import TableFormat

__all__ = ["IcebergSink"]


class IcebergSink(TableSink):
    """Rows land in an Iceberg table exactly once: readers see a checkpoint's rows when its snapshot commits.

    Lifecycle: writers buffer rows; at the checkpoint's pre-commit they write Parquet data files (with the
    table's field ids) under the table's ``data/`` folder, invisible until a snapshot names them; a compactor
    stage merges each partition's files of all subtasks into one; when the checkpoint completes the
    coordinator appends them in one snapshot whose summary holds the job id, the sink uid and
    ``sluice.max-committed-checkpoint-id``, skipped if the history already has that checkpoint. See
    ``docs/tables.md``.

    Args:
        table: the table identifier, ``"namespace.name"``.
        catalog: the catalog's name (pyiceberg's ``load_catalog`` name; also its config section).
        catalog_properties: the catalog's properties (``type``, ``uri``, ``warehouse``, REST/Glue/Hive
            settings), passed to pyiceberg. With none of ``type``/``uri``, an embedded SqlCatalog on SQLite in
            the (local) ``warehouse`` folder.
        warehouse: the warehouse location (a local folder or ``s3://bucket/prefix``).
        partition_by: partition fields: a column (identity) or ``year(col)``, ``month(col)``, ``day(col)``,
            ``hour(col)``, ``bucket(n, col)`` (a hash of the column into ``n`` buckets).
        schema: the table's Arrow schema: creates (or checks) the table before the job starts. Without it the
            first batch's schema creates it.
        schema_mode: ``"strict"`` or ``"merge"`` (new columns join the table's schema in the commit of the
            first checkpoint whose rows carry them: :mod:`sluice.sinks.iceberg.evolve`).
        storage_options: FileIO options: sluice's spelling (``endpoint_url``, ``region_name``,
            ``aws_access_key_id``, ``aws_secret_access_key``, ``aws_session_token``) or pyiceberg ``s3.*`` keys.
        compaction: merge the files all subtasks write for one partition at one checkpoint into one file before
            the commit (a compactor stage keyed by partition).
        rewrite: a RewritePolicy (or dict, or True) for a background rewrite of older small files; None = off.
        compression: Parquet compression of data files.
        table_properties: Iceberg table properties when the sink creates the table.
        mode: ``"append"`` (rows are appended) or ``"upsert"`` (each row an upsert of its key, or change
            batches, :mod:`sluice.changes`, with deletes: per checkpoint they are collapsed to the last change per key and applied as
            one copy-on-write overwrite snapshot; partition by ``bucket(n, key)`` so that a merge rewrites few
            files; see ``docs/tables.md``).
        key_columns: upsert mode: the columns that identify a row (as ``PostgresSink``'s and the Kafka sink's
            ``key_columns``); none given, those the stream's schema names (a change format's).
        name: the sink operator's name.
    """

    options: IcebergSinkOptions

    table = Option[str]()
    catalog = Option[str]()
    catalog_properties = Option[dict[str, Any]]()
    warehouse = Option[str | None]()
    table_properties = Option[dict[str, Any]]()

    def __init__(
        self,
        table: str,
        *,
        catalog: str = "sluice",
        catalog_properties: dict[str, Any] | None = None,
        warehouse: str | None = None,
        partition_by: Sequence[str] = (),
        schema: pa.Schema | None = None,
        schema_mode: str = "strict",
        storage_options: dict[str, Any] | None = None,
        compaction: bool = True,
        rewrite: RewritePolicy | dict[str, Any] | bool | None = None,
        compression: str = "zstd",
        table_properties: dict[str, str] | None = None,
        mode: str = "append",
        key_columns: Sequence[str] | str = (),
        name: str = "iceberg-sink",
        **renamed: Any,
    ) -> None:
        refuse_renamed("IcebergSink", renamed)
        self.options = IcebergSinkOptions.of(
            table=table,
            catalog=catalog,
            catalog_properties=catalog_properties,
            warehouse=warehouse,
            partition_by=partition_by,
            table_schema=schema,
            schema_mode=schema_mode,
            storage_options=storage_options,
            compaction=compaction,
            rewrite=rewrite,
            compression=compression,
            table_properties=table_properties,
            mode=mode,
            key_columns=key_columns,
            name=name,
        )

    def __repr__(self) -> str:  # never shows credentials
        return f"IcebergSink({self.table!r}, partition_by={self.partition_by}, mode={self.mode!r})"

    def validate_schema(self, schema: pa.Schema) -> None:
        """At build time: every partition field's column is in the stream, with a type its transform takes
        (upsert mode: the stream is a change stream with the key columns)."""
        schema = self.row_schema(schema)
        missing = [c for c in (parse_partition(e)[1] for e in self.partition_by) if c not in schema.names]
        if missing:
            raise ConfigError(
                f"IcebergSink: partition_by names column(s) {missing} the stream does not have ({schema.names})"
            )
        partition_fields(self.partition_by, schema)

    def table_format(self) -> TableFormat:
        return IcebergFormat(self.options)

    def change_storage(self) -> Storage:
        return functools.partial(staging_storage, self.options)

    # -- Sink SPI --------------------------------------------------------------------------------------
    def create_global_committer(self, ctx: GlobalCommitterContext) -> GlobalCommitter[TableFile] | None:
        if self.upserts:
            return upsert_committer(self.options, ctx)
        return IcebergCommitter(self.options, ctx)

    def committed_checkpoint(self, job_id: str, sink_uid: str) -> int | None:
        """``sluice.max-committed-checkpoint-id`` of this job and sink's newest snapshot (0 if none, or no
        table yet)."""
        table = open_or_create(self.options, None)
        return 0 if table is None else max_committed_checkpoint(table, job_id, sink_uid)

    def probe(self) -> None:
        """At job start: the catalog answers, and a file can be written and deleted where the table's data
        goes (its location, or for a table still to be made the warehouse)."""
        from pyiceberg.exceptions import NoSuchTableError

        try:
            catalog = load_catalog(self.options)
            catalog.list_namespaces()
        except Exception as exc:
            raise StorageError(
                f"IcebergSink {self.table!r}: catalog {self.catalog!r} cannot be reached: {type(exc).__name__}: "
                f"{exc} (fix catalog_properties, or warehouse for the embedded catalog)",
                operation="probe",
                bucket=str(self.warehouse),
            ) from exc
        try:
            location: str | None = catalog.load_table(self.table).location()
            option = "the table's location"
        except NoSuchTableError:
            location = self.options.catalog_config().get("warehouse")
            option = "warehouse"
        except Exception as exc:
            raise StorageError(
                f"IcebergSink {self.table!r}: catalog {self.catalog!r} cannot load the table: "
                f"{type(exc).__name__}: {exc} (fix catalog_properties)",
                operation="probe",
                bucket=str(self.warehouse),
            ) from exc
        if location is None:
            return  # a catalog that places tables itself: its first commit says
        try:
            probe_location(location, self.storage_options)
        except Exception as exc:
            raise StorageError(
                f"IcebergSink {self.table!r}: {option} {location!r} is not writable: {type(exc).__name__}: {exc} "
                "(fix the warehouse or its permissions; on S3 the bucket, or the credentials and endpoint: "
                "storage_options)",
                operation="probe",
                bucket=location,
            ) from exc

    def recover(self, job_id: str, committables: Sequence[TableFile]) -> None:
        """Create the table if ``schema`` was given, or check an existing one's partition spec (and schema);
        delete data files of ``job_id`` that no completed checkpoint names
        (:func:`~sluice.sinks.iceberg.catalog.remove_orphans`)."""
        schema = self.options.table_schema
        table = open_or_create(self.options, schema)
        if table is None:
            return
        check_spec(self.options, table)
        if schema is not None:
            check_schema(self.options, table, schema)
        remove_orphans(self.options, table, job_id, committables)
