"""The Iceberg copy-on-write merge of one checkpoint's changes: which data files to replace, and the files
that replace them.

1. The manifests name the files that may hold a changed key (:func:`~sluice.sinks.iceberg.prune.touched_files`:
   partition values over key columns, key bounds). Only those are opened.
2. Each such file is read (positional deletes applied, older schemas projected onto the table's); if none of
   its rows has a changed key it is left alone. Otherwise it is **replaced** by a file (or several, of about
   ``target_file_size``) holding its rows without the changed keys, plus the updated rows of those keys that
   belong to its partition, sorted by key: a file keeps its place in the key order.
3. The upserted rows no replaced file took (inserts, and rows that moved partition) go to new files, per
   partition, sorted by key.

Nothing here commits: :class:`~sluice.sinks.iceberg.upsert.IcebergUpsert` commits the replaced and the new
files as one overwrite snapshot. One file is in memory at a time, plus the checkpoint's changes.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from sluice.sinks.iceberg.layout import IcebergLayout, data_file, file_stats
from sluice.sinks.iceberg.prune import touched_files
from sluice.sinks.tables.changes import ChangeError, upserts_and_deletes
from sluice.sinks.tables.files import TableFile, write_parquet

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import FileScanTask, Table

_Read = tuple["FileScanTask", pa.Table, "np.ndarray[Any, np.dtype[np.bool_]]"]

__all__ = ["MergeFiles", "conform", "key_mask", "merge_files"]

#: rows per file when nothing tells the size of a row
_FALLBACK_ROW_BYTES = 64


@dataclass
class MergeFiles:
    """What a merge replaces and adds, and what it wrote (to delete if its commit fails)."""

    replaced: list[DataFile] = field(default_factory=list)
    added: list[DataFile] = field(default_factory=list)
    written: list[str] = field(default_factory=list)
    #: data files whose manifest entry passed the pruning and were opened
    files_read: int = 0
    #: rows copied unchanged from replaced files into their replacements
    rows_copied: int = 0


def conform(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """``rows`` with exactly the columns of ``schema``, in order, cast to its types (absent ones null)."""
    cols = []
    for f in schema:
        col = rows.column(f.name) if f.name in rows.column_names else pa.nulls(rows.num_rows, f.type)
        cols.append(col.cast(f.type) if col.type != f.type else col)
    return pa.Table.from_arrays(cols, schema=schema)


def key_mask(rows: pa.Table, keys: pa.Table) -> np.ndarray[Any, np.dtype[np.bool_]]:
    """For each row of ``rows``, whether its key (the columns of ``keys``) is one of the rows of ``keys``."""
    if rows.num_rows == 0 or keys.num_rows == 0:
        return np.zeros(rows.num_rows, dtype=bool)
    if keys.num_columns == 1:
        name = keys.column_names[0]
        col = rows.column(name)
        values = keys.column(name).combine_chunks()
        if values.type != col.type:
            values = values.cast(col.type)
        found = pc.is_in(col, value_set=values)
        return np.asarray(found.to_numpy(zero_copy_only=False), dtype=bool)
    names = keys.column_names
    indexed = pa.table(
        [*(rows.column(n) for n in names), pa.array(np.arange(rows.num_rows))], names=[*names, "_i"]
    )
    other = pa.table([keys.column(n).cast(rows.schema.field(n).type) for n in names], names=names)
    matched = indexed.join(other, keys=names, join_type="left semi").column("_i").to_numpy()
    mask = np.zeros(rows.num_rows, dtype=bool)
    mask[matched] = True
    return mask


def merge_files(
    table: Table,
    changes: pa.Table,
    keys: Sequence[str],
    fs: pafs.FileSystem,
    root: str,
    name: Callable[[], str],
    checkpoint_id: int,
    compression: str = "zstd",
    target_file_size: int = 128 * 1024 * 1024,
) -> MergeFiles:
    """Write the files that apply ``changes`` (collapsed: one row per key) to ``table``'s current snapshot.

    ``name()`` gives a new file name each call; files go under ``<root>/data/<partition path>/``.
    """
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan
    from pyiceberg.manifest import DataFileContent

    layout = IcebergLayout(table)
    schema, spec = table.schema(), table.spec()
    upserts, _ = upserts_and_deletes(changes)
    changed = changes.select(list(keys))
    groups = {path: rows for _, path, rows in layout.partitions(upserts)} if upserts.num_rows else {}
    placed = {path: np.zeros(rows.num_rows, dtype=bool) for path, rows in groups.items()}
    out = MergeFiles()
    tasks = list(table.scan().plan_files())
    for task in tasks:
        if any(d.content == DataFileContent.EQUALITY_DELETES for d in task.delete_files):
            raise ChangeError(
                f"Iceberg table {table.name()} has equality delete files (written by Flink or another "
                "merge-on-read engine), which pyiceberg cannot read: compact them away (rewrite_data_files in "
                "Spark) before upserting with sluice"
            )
    scan = ArrowScan(table.metadata, table.io, schema, AlwaysTrue())
    row_bytes = [_row_bytes(t.file) for t in tasks if t.file.record_count]
    default_row_bytes = float(np.median(row_bytes)) if row_bytes else _FALLBACK_ROW_BYTES
    write = _Writer(table, layout, fs, root, name, checkpoint_id, compression, target_file_size, keys, out)

    def read(task: FileScanTask) -> tuple[FileScanTask, pa.Table, np.ndarray[Any, np.dtype[np.bool_]]]:
        rows = scan.to_table([task])
        return task, rows, key_mask(rows, changed)

    # reading, matching and writing run on two threads (Arrow releases the GIL): one file is read while the
    # replacement of the previous one is written; placing the updated rows stays on this thread, in order
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="iceberg-merge") as pool:
        writes: deque[Future[None]] = deque()
        for task, rows, hit in _read_ahead(pool, read, touched_files(table, tasks, changed)):
            out.files_read += 1
            if not hit.any():
                continue
            out.replaced.append(task.file)
            kept = conform(rows.filter(pa.array(~hit)), layout.file_schema)
            out.rows_copied += kept.num_rows
            parts = [kept]
            path = spec.partition_to_path(task.file.partition, schema) if spec.fields else ""
            if task.file.spec_id == spec.spec_id and path in groups:
                candidates = groups[path]
                take = key_mask(candidates, rows.filter(pa.array(hit)).select(list(keys))) & ~placed[path]
                placed[path] |= take
                parts.append(candidates.filter(pa.array(take)))
            writes.append(pool.submit(write.rows, pa.concat_tables(parts), _row_bytes(task.file)))
            while len(writes) > 1:  # at most one replacement waits: memory holds a few files at most
                writes.popleft().result()
        for path, rows in groups.items():
            rest = rows.filter(pa.array(~placed[path]))
            if rest.num_rows:
                writes.append(pool.submit(write.rows, rest, default_row_bytes))
        for w in writes:
            w.result()
    return out


def _read_ahead(
    pool: ThreadPoolExecutor, fn: Callable[[FileScanTask], _Read], tasks: Sequence[FileScanTask]
) -> Iterator[_Read]:
    """``fn`` over ``tasks`` in order, the next one running while the caller handles the current one."""
    queue: deque[Future[_Read]] = deque()
    for task in tasks:
        queue.append(pool.submit(fn, task))
        if len(queue) > 1:
            yield queue.popleft().result()
    while queue:
        yield queue.popleft().result()


def _row_bytes(f: DataFile) -> float:
    return f.file_size_in_bytes / f.record_count if f.record_count else _FALLBACK_ROW_BYTES


class _Writer:
    """Writes rows as data files of the table: split by partition, sorted by key, cut at the target size."""

    def __init__(
        self,
        table: Table,
        layout: IcebergLayout,
        fs: pafs.FileSystem,
        root: str,
        name: Callable[[], str],
        checkpoint_id: int,
        compression: str,
        target_file_size: int,
        keys: Sequence[str],
        out: MergeFiles,
    ) -> None:
        self.table, self.layout, self.fs, self.root, self.name = table, layout, fs, root, name
        self.checkpoint_id, self.compression, self.target = checkpoint_id, compression, target_file_size
        self.sort_keys = [(k, "ascending") for k in keys]
        self.out = out

    def rows(self, rows: pa.Table, row_bytes: float) -> None:
        if rows.num_rows == 0:
            return
        per_file = max(1, int(self.target / max(row_bytes, 1.0)))
        for values, path, part in self.layout.partitions(rows):
            part = part.sort_by(self.sort_keys)
            for chunk in _chunks(part, per_file):
                self._file(values, path, chunk)

    def _file(self, values: tuple[tuple[str, Any], ...], path: str, rows: pa.Table) -> None:
        rel = f"data/{path}/{self.name()}" if path else f"data/{self.name()}"
        full = f"{self.root}/{rel}"
        self.out.written.append(full)
        meta = write_parquet(self.fs, full, rows, self.compression)
        size = int(self.fs.get_file_info(full).size or 0)
        stats = file_stats(self.table, meta)
        f = TableFile(rel, size, rows.num_rows, values, path, self.checkpoint_id, rows.schema, stats)
        self.out.added.append(data_file(self.table, f))


def _chunks(rows: pa.Table, size: int) -> Iterator[pa.Table]:
    if rows.num_rows <= size * 1.5:  # no tiny tail file
        yield rows
        return
    n = -(-rows.num_rows // size)
    step = -(-rows.num_rows // n)
    for start in itertools.count(0, step):
        if start >= rows.num_rows:
            return
        yield rows.slice(start, step)
