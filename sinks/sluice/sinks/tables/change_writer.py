"""The writer and compactor stages of a table sink in upsert mode: changes collapsed and staged per checkpoint.

A :class:`ChangeWriter` buffers change batches (:mod:`sluice.sinks.tables.changes`); when the buffer grows
past ``collapse_rows`` (and twice what its last collapse left) it collapses it in place (collapsing is
associative: the order column travels with the rows), so memory holds at most about two rows per key. At pre-commit it collapses what it holds and writes one
staged change file. With the compactor stage (keyed by ``""``: one compactor subtask sees every writer's
file of a checkpoint), a :class:`ChangeCompactor` merges them into one collapsed file in the asynchronous
part of the checkpoint, so the global commit reads one file.

Given no key columns, both take them from the data's schema metadata (:func:`sluice.changes.keys_of`: a
change format names them there).

Plain rows (no ``_sluice_op`` column: window results, a keyed JSON topic) are upserts of their key: the
writer gives each an insert and its own arrival order (the sink reads such a stream through a hash exchange
on the key columns, so every row of a key reaches one writer in order, and the last one wins).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
from sluice.changes import OP, ORDER, Op, keys_of
from sluice.sink import Compactor, SinkContext, SinkWriter
from sluice.sinks.tables.changes import ChangeError, check_changes, collapse, read_staged, stage_changes
from sluice.sinks.tables.files import TableFile, data_file_name, run_token

__all__ = ["ChangeCompactor", "ChangeWriter", "Storage", "resolve_keys"]

#: the table location's file system and root path; given the changes' schema (the table may not exist yet)
Storage = Callable[[pa.Schema | None], tuple[pafs.FileSystem, str]]


def resolve_keys(keys: Sequence[str], schema: pa.Schema) -> list[str]:
    """``keys``, or (when empty) the key columns ``schema``'s metadata names; ChangeError if neither has any."""
    resolved = list(keys) or list(keys_of(schema))
    if not resolved:
        raise ChangeError(
            "an upsert sink was given no key_columns= and the stream's schema names none: give the sink "
            "key_columns=[...] or read with a change format that names them (sluice.changes.with_keys)"
        )
    return resolved


class ChangeWriter(SinkWriter[TableFile]):
    """Buffers change batches; at pre-commit stages them collapsed as one Parquet file.

    Args:
        storage: the table location's file system and root path (resolved at the first pre-commit).
        keys: the key columns (empty: taken from the first batch's schema metadata).
        ctx: the subtask's context.
        compression: Parquet compression of staged files.
        collapse_rows: collapse the buffer in place once it holds more rows than this (and than twice what
            the last collapse left: memory holds at most about twice the live keys).
    """

    def __init__(
        self,
        storage: Storage,
        keys: Sequence[str],
        ctx: SinkContext,
        compression: str = "zstd",
        collapse_rows: int = 1_000_000,
    ) -> None:
        self.storage, self.keys, self.ctx = storage, list(keys), ctx
        self.compression, self.collapse_rows = compression, collapse_rows
        self._resolved: tuple[pafs.FileSystem, str] | None = None
        self._checked: set[pa.Schema] = set()
        self._buffer: list[pa.Table] = []
        self._rows = 0
        self._limit = collapse_rows
        self._run = run_token()
        self._order = 0  # the arrival order this writer gives plain rows

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        if OP not in batch.schema.names and ORDER not in batch.schema.names:
            batch = self._as_upserts(batch)
        if batch.schema not in self._checked:
            self.keys = resolve_keys(self.keys, batch.schema)
            check_changes(batch.schema, self.keys)
            self._checked.add(batch.schema)
        self._buffer.append(pa.Table.from_batches([batch]))
        self._rows += batch.num_rows
        if self._rows > self._limit:
            collapsed = self._collapsed()
            self._buffer, self._rows = [collapsed], collapsed.num_rows
            # many live keys collapse to about as many rows: wait for as many new rows again before the next
            # collapse, or every batch would sort the whole buffer again
            self._limit = max(self.collapse_rows, 2 * collapsed.num_rows)

    def _as_upserts(self, rows: pa.RecordBatch) -> pa.RecordBatch:
        """Plain rows as changes: each an insert (an upsert of its key), ordered as they arrived."""
        n = rows.num_rows
        order = np.arange(self._order, self._order + n, dtype=np.int64)
        self._order += n
        ops = pa.array(np.full(n, int(Op.INSERT), np.int8))
        return rows.append_column(OP, ops).append_column(ORDER, pa.array(order))

    def _collapsed(self) -> pa.Table:
        return collapse(pa.concat_tables(self._buffer, promote_options="permissive"), self.keys)

    def prepare_commit(self, checkpoint_id: int) -> list[TableFile]:
        if not self._buffer:
            return []
        changes = self._collapsed()
        self._buffer, self._rows, self._limit = [], 0, self.collapse_rows
        if self._resolved is None:
            self._resolved = self.storage(changes.schema)
        fs, root = self._resolved
        name = data_file_name(
            self.ctx.job_id, checkpoint_id, self.ctx.subtask, self.ctx.attempt, 0, self._run
        )
        return [stage_changes(fs, root, name, changes, checkpoint_id, self.compression)]


class ChangeCompactor(Compactor[TableFile]):
    """Merges the staged change files all writers wrote for one checkpoint into one collapsed file.

    The merged file is written before the originals are deleted; a crash in between leaves a checkpoint that
    never completes, whose staged files the next attempt deletes
    (:func:`~sluice.sinks.tables.changes.remove_orphaned_changes`).
    """

    def __init__(
        self, storage: Storage, keys: Sequence[str], ctx: SinkContext, compression: str = "zstd"
    ) -> None:
        self.storage, self.keys, self.ctx, self.compression = storage, list(keys), ctx, compression
        self._resolved: tuple[pafs.FileSystem, str] | None = None
        self._run = run_token()
        self._seq = 0

    def key(self, committable: TableFile) -> str:
        return ""  # every change file of a checkpoint meets in one compactor subtask

    def compact(self, checkpoint_id: int, committables: list[TableFile]) -> list[TableFile]:
        by_checkpoint: dict[int, list[TableFile]] = {}
        for c in committables:  # never across checkpoints: each keeps its place in the order of changes
            by_checkpoint.setdefault(c.checkpoint_id, []).append(c)
        out: list[TableFile] = []
        for cid, group in sorted(by_checkpoint.items()):
            out.extend(self._merge(cid, group) if len(group) > 1 else group)
        return out

    def _merge(self, checkpoint_id: int, files: list[TableFile]) -> list[TableFile]:
        if self._resolved is None:
            self._resolved = self.storage(files[0].schema)
        fs, root = self._resolved
        self.ctx.fault_hook("compaction")
        self.keys = resolve_keys(self.keys, files[0].schema)
        changes = read_staged(fs, root, files, self.keys)
        self._seq += 1
        name = data_file_name(
            self.ctx.job_id,
            checkpoint_id,
            self.ctx.subtask,
            self.ctx.attempt,
            self._seq,
            self._run,
            compacted=True,
        )
        merged = stage_changes(fs, root, name, changes, checkpoint_id, self.compression)
        self.ctx.fault_hook("compaction")  # merged file written, originals still there
        for f in files:
            fs.delete_file(f"{root}/{f.path}")
        return [merged]
