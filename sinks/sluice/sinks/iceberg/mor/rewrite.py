"""The merge-on-read background rewrite: per partition, the data files that have deletes (and the small
ones) rewritten without their deleted rows, the position-delete files they made obsolete removed, and every
live manifest entry consolidated, in one ``replace`` snapshot; readers then read no deletes and few manifests.

Rows move: a kept row's new data file and position go into a rewrite map
(:mod:`~sluice.sinks.iceberg.mor.maps`), written before the commit. The index in the writers' keyed state is
not touched: the committer translates a position in a rewritten file when a later checkpoint deletes it (the
key changed), through the maps of the rewrites that committed. So the hand-off needs no message from the
committer to the writers, and holds at every crash point: a rewrite commits whole or not at all, and a map
counts only if its rewrite committed (its new files are live or rewritten since). Equality deletes (Flink's
way) would need no map but cost every reader a join; position deletes cost a reader a filter.

The rewrite reads and writes without the committer's lock and takes it for the commit, which first checks
that no checkpoint deleted rows of the files it rewrote in between (a row deleted after the read would come
back in the new file); if one did, it runs again holding the lock from start to end
(:func:`~sluice.sinks.tables.rewrite.take_turn`): checkpoint commits wait for it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import uuid
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from sluice.sinks.iceberg.layout import JOB_ID, SINK_UID, data_file, file_stats
from sluice.sinks.iceberg.merge import conform
from sluice.sinks.iceberg.mor.deletes import read_deletes
from sluice.sinks.iceberg.mor.live import foreign_snapshots
from sluice.sinks.iceberg.mor.maps import write_map
from sluice.sinks.iceberg.mor.positions import file_id
from sluice.sinks.iceberg.mor.snapshot import commit_files
from sluice.sinks.iceberg.mor.writer import _in_fs
from sluice.sinks.tables.errors import RewriteLostRace
from sluice.sinks.tables.files import TableFile, write_parquet
from sluice.sinks.tables.rewrite import RewritePolicy, take_turn

if TYPE_CHECKING:
    import threading

    import pyarrow.fs as pafs
    from pyiceberg.table import FileScanTask, Table
    from sluice.sink import GlobalCommitterContext
    from sluice.sinks.iceberg.mor.maps import RewriteMaps
    from sluice.sinks.iceberg.options import IcebergSinkOptions

__all__ = ["fold_deletes"]

log = logging.getLogger("sluice.sinks.iceberg")


class MergeOnReadCommitter(Protocol):
    """What the rewrite needs of the merge-on-read committer (sluice.sinks.iceberg.mor.committer), which
    starts it: written here so that the two modules do not import each other."""

    options: IcebergSinkOptions
    ctx: GlobalCommitterContext
    name: str
    lock: threading.Lock
    base: int | None

    def load(self) -> Table: ...
    def storage(self, table: Table) -> tuple[pafs.FileSystem, str]: ...
    def maps(self, table: Table) -> RewriteMaps: ...
    def forget_live(self) -> None: ...

REWRITE = "sluice.rewrite"
MAP = "sluice.rewrite-map"


def fold_deletes(committer: MergeOnReadCommitter, policy: RewritePolicy) -> int:
    """One round: every partition with at least ``policy.min_files`` position-delete files or small data
    files rewritten; returns the data files replaced."""
    table = committer.load()
    if foreign_snapshots(table, committer.ctx.job_id, committer.ctx.sink_uid, committer.base)[0]:
        log.warning("%s: the table changed behind the index: no rewrite", committer.name)
        return 0
    replaced = 0
    for part in _plan(table, policy):
        replaced += take_turn(committer.lock, functools.partial(_rewrite, committer, policy, part))
    return replaced


def _plan(table: Table, policy: RewritePolicy) -> dict[tuple[int, Any], list[FileScanTask]]:
    """Per partition due for a rewrite, its data files that have deletes or are small."""
    groups: dict[tuple[int, Any], list[FileScanTask]] = {}
    for task in table.scan().plan_files():
        groups.setdefault((task.file.spec_id, task.file.partition), []).append(task)
    due = {}
    for part, tasks in groups.items():
        deletes = {d.file_path for t in tasks for d in t.delete_files}
        chosen = [t for t in tasks if t.delete_files or t.file.file_size_in_bytes < policy.target_size]
        if len(deletes) >= policy.min_files or len(chosen) >= policy.min_files:
            due[part] = chosen
    return due


def _rewrite(committer: MergeOnReadCommitter, policy: RewritePolicy, part: tuple[int, Any], held: bool) -> int:
    """Rewrite partition ``part``'s chosen files (planned afresh); commit holding the lock."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    table = committer.load()
    tasks = _plan(table, policy).get(part, [])
    if not tasks:
        return 0
    fs, root = committer.storage(table)
    stored = schema_to_pyarrow(table.schema())
    deletes: dict[str, pa.Table] = {}
    kept, old_files, old_pos = [], [], []
    for task in tasks:
        rows = conform(pq.read_table(_in_fs(task.file.file_path), filesystem=fs), stored)
        live = np.ones(rows.num_rows, bool)
        for d in task.delete_files:
            if d.file_path not in deletes:
                deletes[d.file_path] = read_deletes(fs, _in_fs(d.file_path))
            named = deletes[d.file_path]
            live[named.filter(pc.equal(named.column("file_path"), task.file.file_path)).column("pos").to_numpy()] = False
        at = np.flatnonzero(live)
        kept.append(rows.take(pa.array(at)))
        old_files.append(np.full(len(at), file_id(task.file.file_path), np.int64))
        old_pos.append(at.astype(np.int64))
    rewritten = {t.file.file_path for t in tasks}
    obsolete = {p for p, d in deletes.items() if set(d.column("file_path").unique().to_pylist()) <= rewritten}
    merged = pa.concat_tables(kept)
    written: list[str] = []
    added, new_files, new_pos = [], [], []
    per_file = max(1, int(policy.target_size / max(1.0, _row_bytes(tasks))))
    ppath = table.specs()[part[0]].partition_to_path(part[1], table.schema()) if table.specs()[part[0]].fields else ""
    for start in range(0, merged.num_rows, per_file):
        chunk = merged.slice(start, per_file)
        rel = f"data/{ppath}/rewrite-{uuid.uuid4().hex}.parquet" if ppath else f"data/rewrite-{uuid.uuid4().hex}.parquet"
        written.append(f"{root}/{rel}")
        meta = write_parquet(fs, f"{root}/{rel}", chunk, committer.options.compression)
        f = TableFile(rel, int(fs.get_file_info(f"{root}/{rel}").size or 0), chunk.num_rows, (), "", 0, chunk.schema,
                      {**file_stats(table, meta), "spec_id": part[0]})  # fmt: skip
        df = data_file(table, f, part[1])
        df.spec_id = part[0]
        added.append(df)
        new_files.append(np.full(chunk.num_rows, file_id(df.file_path), np.int64))
        new_pos.append(np.arange(chunk.num_rows, dtype=np.int64))
    cat = functools.partial(np.concatenate, dtype=np.int64)
    rel_map = write_map(fs, root, cat(old_files or [[]]), cat(old_pos or [[]]), cat(new_files or [[]]), cat(new_pos or [[]]))
    written.append(f"{root}/{rel_map}")
    try:
        with contextlib.nullcontext() if held else committer.lock:
            _commit(committer, table, part, tasks, added, rewritten | obsolete, rel_map)
    except BaseException:
        for path in written:  # the commit did not land
            with contextlib.suppress(FileNotFoundError):
                fs.delete_file(path)
        raise
    log.info(
        "%s: rewrite folded %d delete file(s) into %d data file(s) (%d rows kept of %d files)",
        committer.name, len(obsolete), len(added), merged.num_rows, len(tasks),
    )  # fmt: skip
    return len(tasks)


def _row_bytes(tasks: list[FileScanTask]) -> float:
    sizes = [t.file.file_size_in_bytes / t.file.record_count for t in tasks if t.file.record_count]
    return float(np.median(sizes)) if sizes else 64.0


def _commit(
    committer: MergeOnReadCommitter, planned: Table, part: tuple[int, Any], tasks: list[FileScanTask],
    added: list[Any], removed: set[str], rel_map: str,
) -> None:
    """The replace snapshot (the caller holds the lock); RewriteLostRace if a checkpoint deleted rows of
    the rewritten files since they were read (or removed one)."""
    from pyiceberg.table.snapshots import Operation

    table = committer.load()
    now = table.current_snapshot()
    before = planned.current_snapshot()
    if (now.snapshot_id if now else None) != (before.snapshot_id if before else None):
        current = {t.file.file_path: {d.file_path for d in t.delete_files} for t in table.scan().plan_files()}
        for t in tasks:
            if current.get(t.file.file_path) != {d.file_path for d in t.delete_files}:
                raise RewriteLostRace(
                    f"{committer.name}: a checkpoint deleted rows of a file the rewrite read, or replaced it"
                )
    if foreign_snapshots(table, committer.ctx.job_id, committer.ctx.sink_uid, committer.base)[0]:
        raise RewriteLostRace(f"{committer.name}: the table changed behind the index")
    props = {JOB_ID: committer.ctx.job_id, SINK_UID: committer.ctx.sink_uid, REWRITE: "fold deletes", MAP: rel_map}
    commit_files(table, Operation.REPLACE, props, added, removed, consolidate=True)
    committer.maps(table).add(rel_map)
    committer.forget_live()
