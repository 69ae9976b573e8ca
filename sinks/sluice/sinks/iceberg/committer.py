"""The Iceberg sink's global committer: one fast-append snapshot per checkpoint, idempotent by the snapshot
summary (Flink's ``IcebergFilesCommitter``).

Each checkpoint commit's summary holds ``sluice.job-id``, ``sluice.sink-uid`` and
``sluice.max-committed-checkpoint-id``. Before committing, the committer walks the snapshot history from the
current snapshot back and skips a checkpoint the table already has. A commit that loses a race against
another writer is rebased and retried by pyiceberg (the catalog's compare-and-swap of the metadata
location), then by the engine, which reads the history again first.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from sluice.errors import CommitError, ConfigError
from sluice.sink import CommitOutcome, GlobalCommitter, GlobalCommitterContext
from sluice.sinks.iceberg.catalog import load_catalog
from sluice.sinks.iceberg.evolve import stage_new_columns
from sluice.sinks.iceberg.layout import JOB_ID, MAX_COMMITTED, SINK_UID, data_file, max_committed_checkpoint
from sluice.sinks.iceberg.options import IcebergSinkOptions
from sluice.sinks.iceberg.rewrite import rewrite_small_files
from sluice.sinks.tables.errors import TableLineageError
from sluice.sinks.tables.files import TableFile
from sluice.sinks.tables.rewrite import BackgroundRewriter

__all__ = ["IcebergCommitter"]


class IcebergCommitter(GlobalCommitter[TableFile]):
    """Commits each checkpoint's data files as one Iceberg snapshot (on the coordinator)."""

    def __init__(self, options: IcebergSinkOptions, ctx: GlobalCommitterContext) -> None:
        self.options = options
        self.ctx = ctx
        self._tried: set[int] = set()
        #: held by checkpoint commits and by the background rewrite's commit step (its merging too once it lost a race)
        self.lock = threading.Lock()
        self.rewriter: BackgroundRewriter | None = None
        if options.rewrite is not None:
            policy = options.rewrite
            self.rewriter = BackgroundRewriter(
                f"IcebergSink {options.table}",
                policy,
                lambda: rewrite_small_files(options, policy, self.lock),
                ctx.metric,
            )

    def commit(self, checkpoint_id: int, committables: Sequence[TableFile]) -> CommitOutcome:
        try:
            return self._commit(checkpoint_id, committables)
        except (CommitError, ConfigError):
            raise
        except Exception as exc:
            raise CommitError(f"IcebergSink {self.options.table}: commit of checkpoint {checkpoint_id} failed: {exc}") from exc

    def _commit(self, checkpoint_id: int, committables: Sequence[TableFile]) -> CommitOutcome:
        if not committables:
            return CommitOutcome.COMMITTED
        with self.lock:
            table = load_catalog(self.options).load_table(self.options.table)
            self.ctx.fault_hook("table_commit")  # a seam for tests: another writer may commit here
            done = max_committed_checkpoint(table, self.ctx.job_id, self.ctx.sink_uid)
            if done >= checkpoint_id:
                if checkpoint_id in self._tried or checkpoint_id <= (self.ctx.restored_checkpoint_id or 0):
                    return CommitOutcome.ALREADY_COMMITTED
                raise TableLineageError(
                    f"IcebergSink {self.options.table}: the table already holds checkpoint {done} of job "
                    f"{self.ctx.job_id!r}, sink {self.ctx.sink_uid!r}, and this run is about to commit its "
                    f"checkpoint {checkpoint_id}: checkpoint ids restarted (checkpoint storage wiped?). Restore "
                    "the job's latest checkpoint, or give the sink a new uid"
                )
            self._tried.add(checkpoint_id)
            props = {JOB_ID: self.ctx.job_id, SINK_UID: self.ctx.sink_uid, MAX_COMMITTED: str(checkpoint_id)}
            with table.transaction() as tx:
                # new columns (schema_mode="merge") become current with the snapshot whose files carry them
                stage_new_columns(tx, table, [c.schema for c in committables], f"IcebergSink {self.options.table}")
                with tx.update_snapshot(snapshot_properties=props).fast_append() as append:
                    for c in committables:
                        append.append_data_file(data_file(table, c))
        self.ctx.fault_hook("commit")  # the commit landed; the engine does not know yet
        if self.rewriter is not None:
            self.rewriter.committed()
        return CommitOutcome.COMMITTED

    def close(self) -> None:
        if self.rewriter is not None:
            self.rewriter.close()
