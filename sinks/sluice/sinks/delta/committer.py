"""The Delta sink's global committer: one Delta transaction per checkpoint, idempotent by app transaction.

Every commit carries ``txn(appId = "sluice-<job>-<sink uid>", version = checkpoint id)``. delta-rs records
the version but does not check it (delta-rs issue #2580), so before committing the committer reads
``transaction_version(appId)`` and skips a checkpoint the table already has. Two committers racing with the
same app id are caught by delta-rs's conflict checker (a concurrent transaction error): the loser retries,
reads the version again and finds its checkpoint committed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import pyarrow as pa
from sluice.errors import CommitError, ConfigError
from sluice.sink import CommitOutcome, GlobalCommitter, GlobalCommitterContext
from sluice.sinks.delta.options import DeltaSinkOptions
from sluice.sinks.delta.rewrite import rewrite_small_files
from sluice.sinks.delta.table import check_schema, open_table, remove_orphans
from sluice.sinks.tables.errors import TableLineageError
from sluice.sinks.tables.files import TableFile
from sluice.sinks.tables.rewrite import BackgroundRewriter

__all__ = ["DeltaCommitter", "app_id"]

log = logging.getLogger("sluice.sinks.delta")


def app_id(job_id: str, sink_uid: str) -> str:
    """The Delta application id under which a sink of a job records its committed checkpoints."""
    return f"sluice-{job_id}-{sink_uid}"


class DeltaCommitter(GlobalCommitter[TableFile]):
    """Commits each checkpoint's data files in one Delta transaction (on the coordinator).

    Created once per attempt, before the tasks start: it first deletes the data files of checkpoints that
    never completed (:func:`~sluice.sinks.delta.table.remove_orphans`).
    """

    def __init__(self, options: DeltaSinkOptions, ctx: GlobalCommitterContext) -> None:
        self.options = options
        self.ctx = ctx
        self.app_id = app_id(ctx.job_id, ctx.sink_uid)
        self._tried: set[int] = set()
        remove_orphans(options, ctx.job_id, self.app_id, ctx.restored_checkpoint_id)  # once per attempt
        self.rewriter: BackgroundRewriter | None = None
        if options.rewrite is not None:
            policy = options.rewrite
            self.rewriter = BackgroundRewriter(
                f"DeltaSink {options.path}", policy, lambda: rewrite_small_files(options, policy), ctx.metric
            )

    def commit(self, checkpoint_id: int, committables: Sequence[TableFile]) -> CommitOutcome:
        try:
            return self._commit(checkpoint_id, committables)
        except (CommitError, ConfigError):
            raise
        except Exception as exc:
            raise CommitError(f"DeltaSink {self.options.path}: commit of checkpoint {checkpoint_id} failed: {exc}") from exc

    def _commit(self, checkpoint_id: int, committables: Sequence[TableFile]) -> CommitOutcome:
        from deltalake.transaction import (
            AddAction,
            CommitProperties,
            Transaction,
            create_table_with_add_actions,
        )
        if not committables:
            return CommitOutcome.COMMITTED
        table = open_table(self.options)
        now = int(time.time() * 1000)
        adds: list[Any] = [
            AddAction(quote(c.path, safe="/="), c.size, dict(c.partition), now, True, c.stats)
            for c in committables
        ]
        meta = {
            "sluice.job-id": self.ctx.job_id,
            "sluice.sink-uid": self.ctx.sink_uid,
            "sluice.checkpoint-id": checkpoint_id,
        }
        props = CommitProperties(
            custom_metadata=meta,
            max_commit_retries=self.options.commit_retries,
            app_transactions=[Transaction(self.app_id, checkpoint_id)],
        )
        if table is None:  # the first commit creates the table: one version, with the checkpoint's files
            self._tried.add(checkpoint_id)
            from deltalake.schema import Schema

            self.ctx.fault_hook("table_commit")
            first = committables[0]
            full = pa.schema([*first.schema, *first.partition_schema])
            create_table_with_add_actions(
                self.options.path,
                Schema.from_arrow(self.options.table_schema or full),
                adds,
                mode="error",
                partition_by=list(self.options.partition_by) or None,
                name=self.options.table_name,
                configuration=self.options.configuration or None,
                storage_options=self.options.delta_storage_options(),
                commit_properties=props,
            )
            return self._committed()
        done = table.transaction_version(self.app_id)
        if done is not None and done >= checkpoint_id:
            if checkpoint_id in self._tried or checkpoint_id <= (self.ctx.restored_checkpoint_id or 0):
                return CommitOutcome.ALREADY_COMMITTED
            raise TableLineageError(
                f"DeltaSink {self.options.path}: the table already holds checkpoint {done} of app id "
                f"{self.app_id!r}, and this run is about to commit its checkpoint {checkpoint_id}: checkpoint "
                "ids restarted (checkpoint storage wiped?). Restore the job's latest checkpoint, or give the "
                "sink a new uid"
            )
        self._tried.add(checkpoint_id)
        new: dict[str, pa.Field] = {}
        for schema in {c.schema_fp: c.schema for c in committables}.values():
            for f in check_schema(self.options, table, _with_partitions(schema, table)):
                new.setdefault(f.name, f)
        self.ctx.fault_hook("table_commit")  # a seam for tests: another writer may commit here
        if new:  # schema_mode="merge": the new columns join the table in the commit of the rows that bring them
            self._commit_with_new_columns(table, checkpoint_id, committables, props, sorted(new))
            return self._committed()
        table.create_write_transaction(
            adds,
            "append",
            table.schema(),
            partition_by=table.metadata().partition_columns or None,
            commit_properties=props,
        )
        return self._committed()

    def _commit_with_new_columns(
        self, table: Any, checkpoint_id: int, committables: Sequence[TableFile], props: Any, columns: list[str]
    ) -> None:
        """Commit the checkpoint's rows and its new ``columns`` in one Delta version.

        delta-rs commits a schema change only through its own writer (``create_write_transaction`` leaves
        the schema of an append as it was; ``alter.add_columns`` is a version of its own, which a reader
        sees before the rows, and for good if the job never commits them). So this checkpoint's files are
        read back and written again by ``write_deltalake(schema_mode="merge")`` with the checkpoint's app
        transaction: one version with the new schema, the rows and the txn. Only the checkpoint that brings
        a column pays this once; the written files are deleted after the commit (a crash before that
        leaves them unreferenced: readers never see them).
        """
        from deltalake import write_deltalake

        fs, root = self.options.filesystem()
        parts = [_rows_of(fs, root, c) for c in committables]
        data = pa.concat_tables(parts, promote_options="default")
        log.info("DeltaSink %s: columns %s join the table with checkpoint %s's %d rows (written again in one "
                 "commit)", self.options.path, columns, checkpoint_id, data.num_rows)  # fmt: skip
        write_deltalake(
            table,
            data,
            mode="append",
            schema_mode="merge",
            partition_by=table.metadata().partition_columns or None,
            commit_properties=props,
        )
        for c in committables:
            try:
                fs.delete_file(f"{root}/{c.path}")
            except OSError as exc:  # harmless: the table does not reference it
                log.info("DeltaSink %s: could not delete %s after writing it again: %s", self.options.path, c.path, exc)

    def _committed(self) -> CommitOutcome:
        self.ctx.fault_hook("commit")  # the commit landed; the engine does not know yet
        if self.rewriter is not None:
            self.rewriter.committed()
        return CommitOutcome.COMMITTED

    def close(self) -> None:
        if self.rewriter is not None:
            self.rewriter.close()


def _with_partitions(file_schema: Any, table: Any) -> Any:
    """A data file's schema plus the table's partition columns (files leave them out)."""
    import pyarrow as pa

    full = pa.schema(table.schema().to_arrow())
    extra = [full.field(c) for c in table.metadata().partition_columns if c not in file_schema.names]
    return pa.schema([*file_schema, *extra])


def _rows_of(fs: Any, root: str, c: TableFile) -> pa.Table:
    """A written data file's rows with its partition columns (Delta files leave them out) put back."""
    import pyarrow.parquet as pq

    rows = pq.read_table(f"{root}/{c.path}", filesystem=fs)
    for name, value in c.partition:
        field = c.partition_schema.field(name)
        rows = rows.append_column(field, pa.array([value] * rows.num_rows).cast(field.type))
    return rows
