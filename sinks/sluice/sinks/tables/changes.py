"""Changes for the table sinks' upsert mode: the collapse to the last change per key and the change files
staged at pre-commit. The change model (key and row columns, ``_sluice_op``, ``_sluice_order``) is
:mod:`sluice.changes`.

A table applies changes as **upserts**: after a checkpoint, a key holds the row of its last insert, update or
snapshot read, or is absent if its last change is a delete; an insert of a key the table has replaces its
row, an update of a key it lacks inserts the row (Flink's upsert mode, Hudi, Kafka Connect's Iceberg sink).
Both engines refuse a merge source with two rows for one key, so :func:`collapse` first keeps the last
change per key in source order: vectorized (a stable sort by order, then the highest position per key by a
hash aggregation), never a Python call per row.

Staged change files (Parquet, one per writer subtask and checkpoint) live under ``_sluice_changes/`` in the
table's location, named like data files (:func:`~sluice.sinks.tables.files.data_file_name`), so no run ever
overwrites another's. They are written at pre-commit, read by the checkpoint's merge at the global commit,
and deleted once that merge committed (:func:`delete_staged`), or by :func:`remove_orphaned_changes` when
their checkpoint never completed or their merge committed before a crash.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from sluice.changes import OP, ORDER, Op, change_table
from sluice.errors import SluiceError
from sluice.sinks.tables.files import TableFile, data_file_attempt, parse_data_file_name, write_parquet

__all__ = [
    "CHANGES_DIR",
    "CHECKPOINT",
    "OP",
    "ORDER",
    "ChangeError",
    "Op",
    "change_table",
    "check_changes",
    "collapse",
    "delete_staged",
    "read_staged",
    "remove_orphaned_changes",
    "row_columns",
    "stage_changes",
    "upserts_and_deletes",
]

log = logging.getLogger("sluice.sinks.tables")

#: the checkpoint whose pre-commit staged a change (added when staged files of several checkpoints meet)
CHECKPOINT = "_sluice_checkpoint"
#: where staged change files live, relative to the table's location
CHANGES_DIR = "_sluice_changes"

_CONTROL = (OP, ORDER, CHECKPOINT)


class ChangeError(SluiceError):
    """A change batch the sink cannot apply: a key or control column missing, a null key, an unknown
    operation. The same batch fails again after a restart, so the job fails at once; route such records
    to a dead letter before the sink (the Kafka change formats do)."""

    recoverable = False


def row_columns(schema: pa.Schema) -> list[str]:
    """The key and row columns of a change schema (everything but the control columns), in order."""
    return [n for n in schema.names if n not in _CONTROL]


def check_changes(schema: pa.Schema, keys: Sequence[str]) -> None:
    """ChangeError naming the column unless ``schema`` is a change schema with the key columns ``keys``."""
    if not keys:
        raise ChangeError("an upsert needs at least one key column")
    missing = [k for k in keys if k not in schema.names]
    if missing:
        raise ChangeError(f"the changes lack the key column(s) {missing} (columns: {row_columns(schema)})")
    for name, types in ((OP, (pa.int8(),)), (ORDER, (pa.int64(), pa.uint64()))):
        if name not in schema.names:
            raise ChangeError(f"the changes lack the {name} column (see sluice.sinks.tables.changes)")
        if schema.field(name).type not in types:
            raise ChangeError(
                f"the changes' {name} column has type {schema.field(name).type}, expected {types[0]}"
            )


def collapse(changes: pa.Table, keys: Sequence[str], order: Sequence[str] = (ORDER,)) -> pa.Table:
    """The last change per key, in the order of the ``order`` columns (ties: the later row wins).

    Returns one row per key, sorted by key, with every column of ``changes``. Raises ChangeError for a null
    key or order value, or an operation outside :class:`Op`.
    """
    check_changes(changes.schema, keys)
    n = changes.num_rows
    for c in (*keys, OP, *order):
        if changes.column(c).null_count:
            raise ChangeError(
                f"{changes.column(c).null_count} change(s) have a null {c!r}: the key, the operation and the "
                "order are required"
            )
    if n == 0:
        return changes
    ops = changes.column(OP)
    if pc.max(ops).as_py() > max(Op) or pc.min(ops).as_py() < min(Op):
        raise ChangeError(f"the changes' {OP} column holds values outside {[int(o) for o in Op]}")
    # a stable sort by order keeps arrival order among equal orders; the last row per key in that order is
    # the one with the highest position
    by_order = pc.sort_indices(changes.select(list(order)), sort_keys=[(c, "ascending") for c in order])
    names = [f"k{i}" for i in range(len(keys))]
    ranked = pa.table(
        [*(changes.column(k).take(by_order) for k in keys), pa.array(np.arange(n, dtype=np.int64))],
        names=[*names, "pos"],
    )
    picked = by_order.take(ranked.group_by(names).aggregate([("pos", "max")]).column("pos_max"))
    # sort the picked positions by key first, so the (wide) rows are taken once
    by_key = pc.sort_indices(
        pa.table([changes.column(k).take(picked) for k in keys], names=names),
        sort_keys=[(n, "ascending") for n in names],
    )
    return changes.take(picked.take(by_key))


def upserts_and_deletes(collapsed: pa.Table) -> tuple[pa.Table, pa.Table]:
    """The rows of collapsed changes whose last change is an insert, update or read (with the control
    columns dropped), and the keys (with every column) whose last change is a delete."""
    is_delete = pc.equal(collapsed.column(OP), pa.scalar(int(Op.DELETE), pa.int8()))
    upserts = collapsed.filter(pc.invert(is_delete))
    controls = [c for c in _CONTROL if c in collapsed.column_names]
    return upserts.drop_columns(controls), collapsed.filter(is_delete)


# -- staged change files ------------------------------------------------------------------------------------
def stage_changes(
    fs: pafs.FileSystem,
    root: str,
    name: str,
    changes: pa.Table,
    checkpoint_id: int,
    compression: str = "zstd",
) -> TableFile:
    """Write ``changes`` (collapsed) as the staged change file ``_sluice_changes/<name>`` of the table at
    ``root``; returns its committable."""
    rel = f"{CHANGES_DIR}/{name}"
    write_parquet(fs, f"{root}/{rel}", changes, compression)
    size = fs.get_file_info(f"{root}/{rel}").size
    return TableFile(rel, int(size or 0), changes.num_rows, (), "", checkpoint_id, changes.schema)


def read_staged(fs: pafs.FileSystem, root: str, files: Sequence[TableFile], keys: Sequence[str]) -> pa.Table:
    """The staged changes of ``files`` (of one or several checkpoints, from any writer subtasks) collapsed
    to the last change per key, ordered by checkpoint, then source order (one file is read as it is: each
    was written collapsed).

    Files of different schemas (a column added upstream) are unified: a column a file lacks reads as nulls.
    """
    if len(files) == 1:  # a writer's or the compactor's file: collapsed already, one row per key, by key
        return pq.read_table(f"{root}/{files[0].path}", filesystem=fs)
    tables = []
    for f in files:
        t = pq.read_table(f"{root}/{f.path}", filesystem=fs)
        tables.append(t.append_column(CHECKPOINT, pa.array(np.full(t.num_rows, f.checkpoint_id, np.int64))))
    if not tables:
        raise ValueError("read_staged needs at least one staged file")
    merged = pa.concat_tables(tables, promote_options="permissive")
    return collapse(merged, keys, order=(CHECKPOINT, ORDER)).drop_columns([CHECKPOINT])


def delete_staged(fs: pafs.FileSystem, root: str, files: Sequence[TableFile]) -> int:
    """Delete the staged change files of ``files`` (their merge committed); returns how many existed."""
    removed = 0
    for f in files:
        if not f.path.startswith(f"{CHANGES_DIR}/"):
            continue
        try:
            fs.delete_file(f"{root}/{f.path}")
            removed += 1
        except FileNotFoundError:
            pass
    return removed


def remove_orphaned_changes(
    fs: pafs.FileSystem,
    root: str,
    job_id: str,
    committed: int,
    restored: int | None,
    keep: Collection[str] | None = None,
    before_attempt: int | None = None,
) -> int:
    """Delete staged change files of ``job_id`` that no commit will read; returns how many.

    Call it before an attempt's first commit, with ``committed`` the highest checkpoint of the job and sink
    the table holds and ``restored`` the checkpoint the attempt restores (None: none). A file of a checkpoint
    up to ``committed`` was applied (the merge of checkpoint n applies every staged file up to n); one after
    both ``committed`` and ``restored`` belongs to a checkpoint that never completed. Given ``keep`` (the
    paths of every staged file the restored checkpoint names), a file it does not name is deleted as well.
    Given ``before_attempt``, only files that earlier attempts wrote are considered: the committer calls it
    so after each merge, since a subtask of a failed attempt may still be staging (its asynchronous
    checkpoint part outlives the attempt) after the new attempt's first sweep.
    """
    upto = max(committed, restored or 0)
    removed = 0
    selector = pafs.FileSelector(f"{root}/{CHANGES_DIR}", recursive=True, allow_not_found=True)
    for info in fs.get_file_info(selector):
        rel = info.path[len(root) :].lstrip("/")
        parsed = parse_data_file_name(rel)
        if info.type != pafs.FileType.File or parsed is None or parsed[0] != job_id:
            continue
        if before_attempt is not None and (data_file_attempt(rel) or 0) >= before_attempt:
            continue
        if parsed[1] <= committed or parsed[1] > upto or (keep is not None and rel not in keep):
            fs.delete_file(info.path)
            removed += 1
    if removed:
        log.info("deleted %d staged change file(s) of job %s that no commit will read", removed, job_id)
    return removed
