"""``DeltaSink``: exactly-once into a Delta Lake table, one Delta transaction per checkpoint (delta-rs, no JVM)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from sluice.errors import StorageError
from sluice.sink import GlobalCommitter, GlobalCommitterContext
from sluice.sinks.delta.committer import DeltaCommitter, app_id
from sluice.sinks.delta.format import DeltaFormat
from sluice.sinks.delta.options import DeltaSinkOptions
from sluice.sinks.delta.table import check_partitioning, check_schema, create_table, open_table
from sluice.sinks.delta.upsert import upsert_committer
from sluice.sinks.options import Option, refuse_renamed
from sluice.sinks.tables.change_writer import Storage
from sluice.sinks.tables.files import TableFile
from sluice.sinks.tables.rewrite import RewritePolicy
from sluice.sinks.tables.sink import TableSink
from sluice.sinks.tables.storage import probe_location
from sluice.sinks.tables.writer import TableFormat

__all__ = ["DeltaSink"]


class DeltaSink(TableSink):
    """Rows land in a Delta table exactly once: readers see a checkpoint's rows when its transaction commits.

    Lifecycle: writers buffer rows; at the checkpoint's pre-commit they write Parquet files into the table's
    location (no log entry names them: invisible); a compactor stage merges each partition's files of all
    subtasks into one; when the checkpoint completes the coordinator commits them in one Delta transaction
    carrying ``txn(appId="sluice-<job>-<sink uid>", version=<checkpoint>)``, skipped if the table already has
    it. See ``docs/tables.md``.

    Args:
        path: the table: a local folder, ``file://`` or ``s3://bucket/prefix``.
        partition_by: partition columns (string, integer, date or boolean columns of the stream).
        schema: the table's Arrow schema: creates (or checks) the table before the job starts. Without it the
            first checkpoint's commit creates the table, with the stream's schema.
        schema_mode: ``"strict"`` (the stream's columns must be the table's) or ``"merge"`` (new columns are
            added to the table in the version that commits the first rows carrying them; columns the stream
            lacks are written as nulls).
        storage_options: connection options: sluice's spelling (``endpoint_url``, ``region_name``,
            ``aws_access_key_id``, ``aws_secret_access_key``, ``aws_session_token``) or delta-rs keys. On S3
            commits use conditional puts (``If-None-Match``), which the store must support.
        compaction: merge the files all subtasks write for one partition at one checkpoint into one file
            before the commit (a compactor stage keyed by partition).
        rewrite: a RewritePolicy (or dict, or True for the defaults) for a background ``optimize`` that merges
            older small files; None = off.
        compression: Parquet compression of data files.
        commit_retries: how often delta-rs retries a commit that lost a race against another writer (upsert
            mode: how often a merge that lost a race runs again).
        mode: ``"append"`` (rows are appended) or ``"upsert"`` (each row an upsert of its key, or change
            batches, :mod:`sluice.changes`, with deletes: per checkpoint they are collapsed to the last change
            per key and applied as one ``MERGE`` carrying the checkpoint's app transaction; see
            ``docs/tables.md``).
        key_columns: upsert mode: the columns that identify a row (as ``PostgresSink``'s and the Kafka sink's
            ``key_columns``); none given, those the stream's schema names (a change format's).
        table_name: the table's name in its metadata when the sink creates it.
        configuration: Delta table properties when the sink creates it.
        name: the sink operator's name.
    """

    options: DeltaSinkOptions

    path = Option[str]()
    commit_retries = Option[int]()
    table_name = Option[str | None]()
    configuration = Option[dict[str, Any]]()

    def __init__(
        self,
        path: str,
        *,
        partition_by: Sequence[str] = (),
        schema: pa.Schema | None = None,
        schema_mode: str = "strict",
        storage_options: dict[str, Any] | None = None,
        compaction: bool = True,
        rewrite: RewritePolicy | dict[str, Any] | bool | None = None,
        compression: str = "snappy",
        commit_retries: int = 15,
        table_name: str | None = None,
        configuration: dict[str, str | None] | None = None,
        mode: str = "append",
        key_columns: Sequence[str] | str = (),
        name: str = "delta-sink",
        **renamed: Any,
    ) -> None:
        refuse_renamed("DeltaSink", renamed)
        self.options = DeltaSinkOptions.of(
            path=path,
            partition_by=partition_by,
            table_schema=schema,
            schema_mode=schema_mode,
            storage_options=storage_options,
            compaction=compaction,
            rewrite=rewrite,
            compression=compression,
            commit_retries=commit_retries,
            table_name=table_name,
            configuration=configuration,
            mode=mode,
            key_columns=key_columns,
            name=name,
        )

    def __repr__(self) -> str:  # never shows credentials
        return f"DeltaSink({self.path!r}, partition_by={self.partition_by}, mode={self.mode!r})"

    def validate_schema(self, schema: pa.Schema) -> None:
        """At build time: the partition columns are in the stream, with types Delta can partition by (upsert
        mode: the stream is a change stream with the key columns)."""
        check_partitioning(self.options, self.row_schema(schema))

    def table_format(self) -> TableFormat:
        return DeltaFormat(self.options)

    def change_storage(self) -> Storage:
        options = self.options
        return lambda schema: options.filesystem()

    # -- Sink SPI --------------------------------------------------------------------------------------
    def create_global_committer(self, ctx: GlobalCommitterContext) -> GlobalCommitter[TableFile] | None:
        if self.upserts:
            return upsert_committer(self.options, ctx)
        return DeltaCommitter(self.options, ctx)

    def committed_checkpoint(self, job_id: str, sink_uid: str) -> int | None:
        """The table's app transaction version of this job and sink (0 if none, or no table yet)."""
        table = open_table(self.options)
        return 0 if table is None else int(table.transaction_version(app_id(job_id, sink_uid)) or 0)

    def probe(self) -> None:
        """At job start: write and delete a file in the table's folder (created if missing)."""
        try:
            probe_location(self.path, self.storage_options)
        except Exception as exc:
            raise StorageError(
                f"DeltaSink path {self.path!r} is not writable: {type(exc).__name__}: {exc} (fix the path or "
                "its permissions; on S3 the bucket, or the credentials and endpoint: storage_options)",
                operation="probe",
                bucket=self.path,
            ) from exc

    def recover(self, job_id: str, committables: Sequence[TableFile]) -> None:
        """Create the table if ``schema`` was given, or check its schema. (Files of checkpoints that never
        completed are deleted by the global committer, which knows the sink's app id:
        :func:`~sluice.sinks.delta.table.remove_orphans`.)"""
        table = open_table(self.options)
        schema = self.options.table_schema
        if table is None and schema is not None:
            create_table(self.options, schema)
        elif table is not None and schema is not None:
            check_schema(self.options, table, schema)
