"""``IcebergSink``: exactly-once into an Apache Iceberg table, one snapshot per checkpoint (pyiceberg)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from sluice.errors import ConfigError
from sluice.sink import GlobalCommitter, GlobalCommitterContext
from sluice.sinks.tables.files import TableFile, parse_data_file_name
from sluice.sinks.tables.rewrite import RewritePolicy, rewrite_policy
from sluice.sinks.tables.sink import TableSink
from sluice.sinks.tables.storage import arrow_filesystem
from sluice.sinks.tables.writer import TableLayout

__all__ = ["IcebergSink"]

log = logging.getLogger("sluice.sinks.iceberg")


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
            ``hour(col)``.
        schema: the table's Arrow schema: creates (or checks) the table before the job starts. Without it the
            first batch's schema creates it.
        schema_mode: ``"strict"`` or ``"merge"`` (new columns are added to the table's schema by the first
            writer that sees them, before it writes a file with them).
        storage_options: FileIO options: sluice's spelling (``endpoint_url``, ``region_name``,
            ``aws_access_key_id``, ``aws_secret_access_key``, ``aws_session_token``) or pyiceberg ``s3.*`` keys.
        compaction: merge the files all subtasks write for one partition at one checkpoint into one file before
            the commit (a compactor stage keyed by partition).
        rewrite: a RewritePolicy (or dict, or True) for a background rewrite of older small files; None = off.
        compression: Parquet compression of data files.
        table_properties: Iceberg table properties when the sink creates the table.
        name: the sink operator's name.
    """

    COMPRESSIONS = ("zstd", "snappy", "gzip", "lz4", "none")

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
        name: str = "iceberg-sink",
    ) -> None:
        self.table = table
        self.catalog = catalog
        self.catalog_properties = dict(catalog_properties or {})
        self.warehouse = warehouse
        self.partition_by = [partition_by] if isinstance(partition_by, str) else list(partition_by)
        self.schema = schema
        self.schema_mode = schema_mode
        self.storage_options = dict(storage_options or {})
        self.compaction = compaction
        self.rewrite = rewrite_policy(rewrite, "IcebergSink")
        self.compression = compression
        self.table_properties = dict(table_properties or {})
        self.name = name
        self._meta: Any = None  # the table, loaded once per process (never pickled)
        self.validate()

    def __repr__(self) -> str:  # never shows credentials
        return f"IcebergSink({self.table!r}, partition_by={self.partition_by})"

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_meta": None}

    def validate(self) -> None:
        """Raise ConfigError naming the wrong option and the allowed values."""
        from sluice.sinks.iceberg.catalog import (
            catalog_properties,
            import_pyiceberg,
            parse_partition,
            partition_fields,
        )

        import_pyiceberg()
        parts = self.table.split(".") if isinstance(self.table, str) else []
        if len(parts) < 2 or not all(p.strip() for p in parts):
            raise ConfigError(
                f"IcebergSink: table must be 'namespace.name' (got {self.table!r}), e.g. 'analytics.events'"
            )
        for entry in self.partition_by:
            parse_partition(entry)
        self.validate_table_options()
        if self.schema is not None:
            partition_fields(self, self.schema)
        catalog_properties(self)

    def validate_schema(self, schema: pa.Schema) -> None:
        """At build time: every partition field's column is in the stream, with a type its transform takes."""
        from sluice.sinks.iceberg.catalog import parse_partition, partition_fields

        missing = [c for c in (parse_partition(e)[1] for e in self.partition_by) if c not in schema.names]
        if missing:
            raise ConfigError(
                f"IcebergSink: partition_by names column(s) {missing} the stream does not have ({schema.names})"
            )
        partition_fields(self, schema)

    # -- what the shared writer and compactor need ----------------------------------------------------
    def loaded(self, schema: pa.Schema | None = None, refresh: bool = False) -> Any:
        """The table (created from ``schema`` if missing), cached in this process."""
        from sluice.sinks.iceberg.catalog import open_or_create

        if self._meta is None or refresh:
            self._meta = open_or_create(self, schema)
        return self._meta

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        table = self.loaded()
        return arrow_filesystem(table.location(), self.storage_options)

    def data_path(self, partition_path: str, name: str) -> str:
        return f"data/{partition_path}/{name}" if partition_path else f"data/{name}"

    def layout(self, schema: pa.Schema) -> TableLayout:
        from sluice.sinks.iceberg.catalog import check_schema, check_spec
        from sluice.sinks.iceberg.layout import IcebergLayout

        table = self.loaded(schema, refresh=True)
        check_spec(self, table)
        for _ in range(10):
            if not check_schema(self, table, schema):
                break
            try:  # merge: new columns join the table's schema (with field ids) before any file has them
                with table.update_schema() as update:
                    update.union_by_name(schema)
            except Exception as exc:  # another writer evolved it at the same moment: look again
                log.info("%s: schema update lost a race, retrying: %s", self.name, exc)
            table = self.loaded(refresh=True)
        return IcebergLayout(table)

    def file_stats(self, meta: pq.FileMetaData, table: pa.Table) -> Any:
        from sluice.sinks.iceberg.layout import file_stats

        return file_stats(self.loaded(), meta)

    # -- Sink SPI --------------------------------------------------------------------------------------
    def create_global_committer(self, ctx: GlobalCommitterContext) -> GlobalCommitter[TableFile] | None:
        from sluice.sinks.iceberg.committer import IcebergCommitter

        return IcebergCommitter(self, ctx)

    def committed_checkpoint(self, job_id: str, sink_uid: str) -> int | None:
        """``sluice.max-committed-checkpoint-id`` of this job and sink's newest snapshot (0 if none, or no
        table yet)."""
        from sluice.sinks.iceberg.layout import max_committed_checkpoint

        table = self.loaded(refresh=True)
        return 0 if table is None else max_committed_checkpoint(table, job_id, sink_uid)

    def recover(self, job_id: str, committables: Sequence[TableFile]) -> None:
        """Create the table if ``schema`` was given, or check an existing one's partition spec (and schema);
        delete data files of ``job_id`` that no completed checkpoint names: files of checkpoints after the
        last one the job committed (and after the restored one) that neither the restored checkpoint nor the
        current snapshot references."""
        from sluice.sinks.iceberg.catalog import check_schema, check_spec
        from sluice.sinks.iceberg.layout import max_committed_checkpoint

        table = self.loaded(self.schema, refresh=True)
        if table is None:
            return
        check_spec(self, table)
        if self.schema is not None:
            check_schema(self, table, self.schema)
        location = table.location().rstrip("/")
        keep = {c.path for c in committables}
        keep |= {t.file.file_path[len(location) + 1 :] for t in table.scan().plan_files()}
        upto = max([max_committed_checkpoint(table, job_id, None), *(c.checkpoint_id for c in committables)])
        fs, root = arrow_filesystem(location, self.storage_options)
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
                self.name,
                removed,
                job_id,
            )
