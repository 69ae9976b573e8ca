"""``DeltaSink``: exactly-once into a Delta Lake table, one Delta transaction per checkpoint (delta-rs, no JVM)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from sluice.errors import ConfigError
from sluice.sink import GlobalCommitter, GlobalCommitterContext
from sluice.sinks.tables.files import TableFile, parse_data_file_name
from sluice.sinks.tables.rewrite import RewritePolicy, rewrite_policy
from sluice.sinks.tables.sink import TableSink
from sluice.sinks.tables.storage import arrow_filesystem, delta_options, split_uri
from sluice.sinks.tables.writer import TableLayout

__all__ = ["DeltaSink"]

log = logging.getLogger("sluice.sinks.delta")


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
            added to the table; columns the stream lacks are written as nulls).
        storage_options: connection options: sluice's spelling (``endpoint_url``, ``region_name``,
            ``aws_access_key_id``, ``aws_secret_access_key``, ``aws_session_token``) or delta-rs keys. On S3
            commits use conditional puts (``If-None-Match``), which the store must support.
        compaction: merge the files all subtasks write for one partition at one checkpoint into one file
            before the commit (a compactor stage keyed by partition).
        rewrite: a RewritePolicy (or dict, or True for the defaults) for a background ``optimize`` that merges
            older small files; None = off.
        compression: Parquet compression of data files.
        commit_retries: how often delta-rs retries a commit that lost a race against another writer.
        table_name: the table's name in its metadata when the sink creates it.
        configuration: Delta table properties when the sink creates it.
        name: the sink operator's name.
    """

    COMPRESSIONS = ("snappy", "zstd", "gzip", "lz4", "none")

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
        name: str = "delta-sink",
    ) -> None:
        self.path = path
        self.partition_by = [partition_by] if isinstance(partition_by, str) else list(partition_by)
        self.schema = schema
        self.schema_mode = schema_mode
        self.storage_options = dict(storage_options or {})
        self.compaction = compaction
        self.rewrite = rewrite_policy(rewrite, "DeltaSink")
        self.compression = compression
        self.commit_retries = commit_retries
        self.table_name = table_name
        self.configuration = dict(configuration or {})
        self.name = name
        self.validate()

    def __repr__(self) -> str:  # never shows credentials
        return f"DeltaSink({self.path!r}, partition_by={self.partition_by})"

    def validate(self) -> None:
        """Raise ConfigError naming the wrong option and the allowed values."""
        from sluice.sinks.delta.table import import_deltalake

        import_deltalake()
        if not isinstance(self.path, str) or not self.path:
            raise ConfigError(
                f"DeltaSink: path must be a local folder, file:// or s3://bucket/prefix (got {self.path!r})"
            )
        split_uri(self.path)
        delta_options(self.path, self.storage_options)
        self.validate_table_options()
        if self.schema is not None:
            missing = [c for c in self.partition_by if c not in self.schema.names]
            if missing:
                raise ConfigError(
                    f"DeltaSink: partition_by names column(s) {missing} not in schema ({self.schema.names})"
                )
        if (
            isinstance(self.commit_retries, bool)
            or not isinstance(self.commit_retries, int)
            or self.commit_retries < 0
        ):
            raise ConfigError(
                f"DeltaSink: commit_retries must be an integer >= 0 (got {self.commit_retries!r})"
            )

    def validate_schema(self, schema: pa.Schema) -> None:
        """At build time: the partition columns are in the stream, with types Delta can partition by."""
        from sluice.sinks.delta.table import check_partitioning

        check_partitioning(self, schema)

    # -- what the shared writer and compactor need ----------------------------------------------------
    def delta_storage_options(self) -> dict[str, str]:
        """Storage options in delta-rs's spelling."""
        return delta_options(self.path, self.storage_options)

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        return arrow_filesystem(self.path, self.storage_options)

    def data_path(self, partition_path: str, name: str) -> str:
        return f"{partition_path}/{name}" if partition_path else name

    def layout(self, schema: pa.Schema) -> TableLayout:
        from sluice.sinks.delta.table import DeltaLayout, check_partitioning, check_schema, open_table

        table = open_table(self)
        if table is None:  # the first commit creates it (on the driver) with this schema
            check_partitioning(self, schema)
            return DeltaLayout(schema, self.partition_by)
        new = check_schema(self, table, schema)
        full = pa.schema([*pa.schema(table.schema().to_arrow()), *new])
        return DeltaLayout(full, table.metadata().partition_columns)

    def file_stats(self, meta: pq.FileMetaData, table: pa.Table) -> Any:
        from sluice.sinks.delta.table import delta_stats

        return delta_stats(table)

    # -- Sink SPI --------------------------------------------------------------------------------------
    def create_global_committer(self, ctx: GlobalCommitterContext) -> GlobalCommitter[TableFile] | None:
        from sluice.sinks.delta.committer import DeltaCommitter

        return DeltaCommitter(self, ctx)

    def committed_checkpoint(self, job_id: str, sink_uid: str) -> int | None:
        """The table's app transaction version of this job and sink (0 if none, or no table yet)."""
        from sluice.sinks.delta.committer import app_id
        from sluice.sinks.delta.table import open_table

        table = open_table(self)
        return 0 if table is None else int(table.transaction_version(app_id(job_id, sink_uid)) or 0)

    def recover(self, job_id: str, committables: Sequence[TableFile]) -> None:
        """Create the table if ``schema`` was given, or check its schema. (Files of checkpoints that never
        completed are deleted by the global committer, which knows the sink's app id: :func:`remove_orphans`.)"""
        from sluice.sinks.delta.table import check_schema, create_table, open_table

        table = open_table(self)
        if table is None and self.schema is not None:
            create_table(self, self.schema)
        elif table is not None and self.schema is not None:
            check_schema(self, table, self.schema)


def remove_orphans(sink: DeltaSink, job_id: str, app_id: str, restored_checkpoint_id: int | None) -> int:
    """Delete data files of ``job_id`` written for checkpoints that never completed; returns how many.

    Those are the job's files of checkpoints after both the restored one and the last one the table has
    (``transaction_version(app_id)``) that the table's current version does not reference. Files of the
    restored checkpoint and earlier are committed, or about to be by the restored checkpoint's re-commit.
    """
    from sluice.sinks.delta.table import open_table

    table = open_table(sink)
    if table is None:
        return 0
    active = set(pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist())
    upto = max(table.transaction_version(app_id) or 0, restored_checkpoint_id or 0)
    fs, root = sink.filesystem()
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
            sink.name,
            removed,
            job_id,
        )
    return removed
