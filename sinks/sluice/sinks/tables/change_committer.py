"""The global committer of a table sink in upsert mode: per checkpoint, the staged changes read back,
collapsed and applied as one merge, idempotent by the checkpoint id the table records.

The table-format part is a :class:`ChangeEngine` (:class:`~sluice.sinks.delta.upsert.DeltaUpsert`,
:class:`~sluice.sinks.iceberg.upsert.IcebergUpsert`). Before the attempt's first commit the committer deletes
staged change files no commit will read (:func:`~sluice.sinks.tables.changes.remove_orphaned_changes`) and,
if the engine writes files of its own, those of merges whose commit never landed. After a merge landed (or
was found in the table) the checkpoint's staged files are deleted, and so are staged files of earlier attempts
that no commit will read: a failed attempt's subtask may still have been staging during the first sweep. Given no key columns, the committer takes
them from the staged files' schema metadata (:func:`sluice.changes.keys_of`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import pyarrow as pa
import pyarrow.fs as pafs
from sluice.errors import CommitError, ConfigError
from sluice.sink import CommitOutcome, GlobalCommitter, GlobalCommitterContext
from sluice.sinks.tables.change_writer import resolve_keys
from sluice.sinks.tables.changes import delete_staged, read_staged, remove_orphaned_changes
from sluice.sinks.tables.errors import TableLineageError
from sluice.sinks.tables.files import TableFile

__all__ = ["ChangeCommitter", "ChangeEngine"]

log = logging.getLogger("sluice.sinks.tables")


class ChangeEngine(Protocol):
    """Applies a checkpoint's collapsed changes to a table as one commit recording the checkpoint id."""

    def committed(self) -> int:
        """The highest checkpoint of the job and sink the table holds (0 if none)."""

    def apply(
        self, checkpoint_id: int, changes: pa.Table, fault_hook: Callable[[str], None]
    ) -> CommitOutcome:
        """Merge ``changes``; ``ALREADY_COMMITTED`` if the table holds the checkpoint."""

    def with_keys(self, keys: Sequence[str]) -> ChangeEngine:
        """This engine merging on ``keys``."""


class ChangeCommitter(GlobalCommitter[TableFile]):
    """Commits each checkpoint's staged changes as one merge (on the coordinator).

    Args:
        name: the sink and table, for messages (``"DeltaSink s3://lake/t"``).
        engine: the table format's merge.
        storage: the table location's file system and root path, or None if there is no table yet.
        keys: the key columns (empty: taken from the staged files' schema metadata).
        ctx: the global committer's context.
        on_commit: called after each merge that landed (e.g. to count commits for a background rewrite).
        remove_orphans: deletes files of the engine's merges whose commit never landed (Iceberg).
        on_close: called when the committer closes (e.g. to stop a background rewrite).
    """

    def __init__(
        self,
        name: str,
        engine: ChangeEngine,
        storage: Callable[[], tuple[pafs.FileSystem, str] | None],
        keys: Sequence[str],
        ctx: GlobalCommitterContext,
        on_commit: Callable[[], None] | None = None,
        remove_orphans: Callable[[], int] | None = None,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self.name, self.engine, self.keys, self.ctx, self.on_commit = name, engine, list(keys), ctx, on_commit
        self.on_close = on_close
        self._storage = storage
        self._tried: set[int] = set()
        located = storage()
        if located is not None:  # once per attempt, before its first commit
            fs, root = located
            remove_orphaned_changes(fs, root, ctx.job_id, engine.committed(), ctx.restored_checkpoint_id)
        if remove_orphans is not None:
            remove_orphans()

    def commit(self, checkpoint_id: int, committables: Sequence[TableFile]) -> CommitOutcome:
        try:
            return self._commit(checkpoint_id, committables)
        except (CommitError, ConfigError):
            raise
        except Exception as exc:
            if not getattr(exc, "recoverable", True):
                raise
            raise CommitError(f"{self.name}: merge of checkpoint {checkpoint_id} failed: {exc}") from exc

    def _commit(self, checkpoint_id: int, committables: Sequence[TableFile]) -> CommitOutcome:
        if not committables:
            return CommitOutcome.COMMITTED
        located = self._storage()
        if located is None:
            raise CommitError(
                f"{self.name}: the table is gone, but checkpoint {checkpoint_id} staged changes for it"
            )
        fs, root = located
        done = self.engine.committed()
        if done >= checkpoint_id:
            if checkpoint_id not in self._tried and checkpoint_id > (self.ctx.restored_checkpoint_id or 0):
                raise TableLineageError(
                    f"{self.name}: the table already holds checkpoint {done} of job {self.ctx.job_id!r}, sink "
                    f"{self.ctx.sink_uid!r}, and this run is about to merge its checkpoint {checkpoint_id}: "
                    "checkpoint ids restarted (checkpoint storage wiped?). Restore the job's latest checkpoint, "
                    "or give the sink a new uid"
                )
            delete_staged(fs, root, committables)
            self._sweep_late_orphans(fs, root, checkpoint_id)
            return CommitOutcome.ALREADY_COMMITTED
        self._tried.add(checkpoint_id)
        if not self.keys:
            self.keys = resolve_keys((), committables[0].schema)
            self.engine = self.engine.with_keys(self.keys)
        started = time.perf_counter()
        changes = read_staged(fs, root, committables, self.keys)
        read = time.perf_counter()
        outcome = self.engine.apply(checkpoint_id, changes, self.ctx.fault_hook)
        log.info(
            "%s: checkpoint %d: %d changes read in %.2f s, merged in %.2f s (%s)",
            self.name, checkpoint_id, changes.num_rows, read - started, time.perf_counter() - read, outcome.value,
        )
        if outcome is CommitOutcome.RETRY_LATER:
            return outcome
        if outcome is CommitOutcome.COMMITTED:
            self.ctx.fault_hook("commit")  # the merge landed; the engine does not know yet
        delete_staged(fs, root, committables)
        self._sweep_late_orphans(fs, root, checkpoint_id)
        if outcome is CommitOutcome.COMMITTED and self.on_commit is not None:
            self.on_commit()
        return outcome

    def _sweep_late_orphans(self, fs: pafs.FileSystem, root: str, checkpoint_id: int) -> None:
        """Delete staged files of earlier attempts that no commit will read, now that ``checkpoint_id``
        merged: a subtask of a failed attempt can still be staging (a compactor merging in the asynchronous
        part of its checkpoint) after this attempt's first sweep."""
        if self.ctx.attempt > 0:
            remove_orphaned_changes(
                fs, root, self.ctx.job_id, checkpoint_id, self.ctx.restored_checkpoint_id,
                before_attempt=self.ctx.attempt,
            )

    def close(self) -> None:
        if self.on_close is not None:
            self.on_close()
