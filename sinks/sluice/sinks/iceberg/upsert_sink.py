"""The Iceberg sink's upsert mode: where the writers stage change files, and the global committer that merges
them (:class:`~sluice.sinks.iceberg.upsert.IcebergUpsert` behind a
:class:`~sluice.sinks.tables.change_committer.ChangeCommitter`)."""

from __future__ import annotations

import threading

import pyarrow as pa
import pyarrow.fs as pafs
from sluice.sink import GlobalCommitterContext
from sluice.sinks.iceberg.catalog import open_or_create
from sluice.sinks.iceberg.options import IcebergSinkOptions
from sluice.sinks.iceberg.rewrite import rewrite_small_files
from sluice.sinks.iceberg.upsert import IcebergUpsert
from sluice.sinks.tables.change_committer import ChangeCommitter
from sluice.sinks.tables.changes import row_columns
from sluice.sinks.tables.errors import TableSchemaError
from sluice.sinks.tables.rewrite import BackgroundRewriter
from sluice.sinks.tables.storage import arrow_filesystem

__all__ = ["located", "staging_storage", "upsert_committer"]


def staging_storage(options: IcebergSinkOptions, changes: pa.Schema | None) -> tuple[pafs.FileSystem, str]:
    """The table's location, where writers stage change files; the table is created from the changes' row
    columns (or the sink's ``schema``) and partition spec if it is missing."""
    rows = options.table_schema
    if changes is not None:
        rows = pa.schema([changes.field(c) for c in row_columns(changes)]).remove_metadata()
    table = open_or_create(options, rows)
    if table is None:
        raise TableSchemaError(f"IcebergSink {options.table}: no table and no schema to create it from")
    return arrow_filesystem(table.location().rstrip("/"), options.storage_options)


def located(options: IcebergSinkOptions) -> tuple[pafs.FileSystem, str] | None:
    """The table's location, or None if there is no table yet."""
    table = open_or_create(options, None)
    return None if table is None else arrow_filesystem(table.location().rstrip("/"), options.storage_options)


def upsert_committer(options: IcebergSinkOptions, ctx: GlobalCommitterContext) -> ChangeCommitter:
    """The global committer of an IcebergSink in upsert mode: one copy-on-write merge per checkpoint; the
    background rewrite of ``options.rewrite`` shares the merge's lock."""
    lock = threading.Lock()
    engine = IcebergUpsert(
        lambda schema: open_or_create(options, schema),
        tuple(options.key_columns),
        ctx.job_id,
        ctx.sink_uid,
        storage_options=options.storage_options,
        schema_mode=options.schema_mode,
        compression=options.compression,
        attempt=ctx.attempt,
        lock=lock,
    )
    rewriter: BackgroundRewriter | None = None
    if options.rewrite is not None:
        policy = options.rewrite
        rewriter = BackgroundRewriter(
            f"IcebergSink {options.table}", policy, lambda: rewrite_small_files(options, policy, lock), ctx.metric
        )
    return ChangeCommitter(
        f"IcebergSink {options.table}",
        engine,
        lambda: located(options),
        options.key_columns,
        ctx,
        on_commit=rewriter.committed if rewriter is not None else None,
        remove_orphans=engine.remove_orphans,
        on_close=rewriter.close if rewriter is not None else None,
    )
