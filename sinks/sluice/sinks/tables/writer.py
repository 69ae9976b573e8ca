"""The writer and the compactor shared by the table sinks.

A writer buffers its batches until the checkpoint's pre-commit, then writes one Parquet file per partition
into the table's location (invisible: no table commit names it yet) and hands :class:`TableFile`
committables over. With a compactor stage (the default) the files of all writer subtasks for one partition
meet in one compactor subtask, which merges them in the asynchronous part of the same checkpoint: one file
per partition and checkpoint, and readers see it when the checkpoint's table commit lands, as without
compaction.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from sluice.sink import Compactor, SinkContext, SinkWriter
from sluice.sinks.tables.files import TableFile, data_file_name, run_token, schema_fingerprint, write_parquet

__all__ = ["TableCompactor", "TableFormat", "TableLayout", "TableWriter"]


class TableLayout(Protocol):
    """How rows of one stream schema become data files of the table (made by :meth:`TableFormat.layout`)."""

    @property
    def partition_schema(self) -> pa.Schema:
        """The stream's partition columns that the files leave out (empty if they keep them all)."""

    def partitions(self, table: pa.Table) -> list[tuple[tuple[tuple[str, Any], ...], str, pa.Table]]:
        """``(partition values, partition path, rows as stored in the file)`` per partition of ``table``."""


class TableFormat(Protocol):
    """What the shared writer and compactor need of a table (``DeltaFormat``, ``IcebergFormat``, made from a
    table sink's options)."""

    compression: str

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        """A pyarrow file system and the table's root path in it."""

    def data_path(self, partition_path: str, name: str) -> str:
        """A data file's path relative to the table root."""

    def layout(self, schema: pa.Schema) -> TableLayout:
        """The layout for a stream schema: creates the table if missing, checks the schema if it exists."""

    def file_stats(self, meta: pq.FileMetaData, table: pa.Table) -> Any:
        """The statistics a commit records for a data file holding ``table``."""


class TableWriter(SinkWriter[TableFile]):
    """Buffers batches; at pre-commit writes one file per partition (and stream schema) into the table."""

    def __init__(self, fmt: TableFormat, ctx: SinkContext) -> None:
        self.fmt = fmt
        self.ctx = ctx
        self._storage: tuple[pafs.FileSystem, str] | None = None  # resolved once the table exists
        self._layouts: dict[str, TableLayout] = {}
        self._buffers: dict[str, list[pa.RecordBatch]] = {}
        self._run = run_token()

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        fp = schema_fingerprint(batch.schema)
        if fp not in self._layouts:
            self._layouts[fp] = self.fmt.layout(batch.schema)
        self._buffers.setdefault(fp, []).append(batch)

    def prepare_commit(self, checkpoint_id: int) -> list[TableFile]:
        out: list[TableFile] = []
        seq = 0
        buffers, self._buffers = self._buffers, {}
        if buffers and self._storage is None:
            self._storage = self.fmt.filesystem()
        fs, root = self._storage if self._storage is not None else (None, "")
        for fp, batches in buffers.items():
            table = pa.Table.from_batches(batches)
            layout = self._layouts[fp]
            for partition, ppath, rows in layout.partitions(table):
                name = data_file_name(
                    self.ctx.job_id, checkpoint_id, self.ctx.subtask, self.ctx.attempt, seq, self._run
                )
                seq += 1
                f = write_file(self.fmt, fs, root, partition, ppath, name, rows, checkpoint_id)
                out.append(dataclasses.replace(f, partition_schema=layout.partition_schema))
        return out


def write_file(
    fmt: TableFormat,
    fs: pafs.FileSystem,
    root: str,
    partition: tuple[tuple[str, Any], ...],
    partition_path: str,
    name: str,
    rows: pa.Table,
    checkpoint_id: int,
) -> TableFile:
    """Write ``rows`` as the data file ``name`` of ``partition_path`` and describe it as a committable."""
    rel = fmt.data_path(partition_path, name)
    meta = write_parquet(fs, f"{root}/{rel}", rows, fmt.compression)
    size = fs.get_file_info(f"{root}/{rel}").size
    return TableFile(
        rel,
        int(size),
        rows.num_rows,
        partition,
        partition_path,
        checkpoint_id,
        rows.schema,
        fmt.file_stats(meta, rows),
    )


class TableCompactor(Compactor[TableFile]):
    """Merges the files all writer subtasks wrote for one partition at one checkpoint into one file.

    The merged file is written first; only then are the originals (never committed: they belong to this
    checkpoint) deleted. A crash in between leaves a checkpoint that never completes, and ``Sink.recover``
    deletes every file of it.
    """

    def __init__(self, fmt: TableFormat, ctx: SinkContext) -> None:
        self.fmt = fmt
        self.ctx = ctx
        self._storage: tuple[pafs.FileSystem, str] | None = None
        self.hook: Callable[[str], None] = ctx.fault_hook
        self._run = run_token()

    def key(self, committable: TableFile) -> str:
        return committable.partition_path

    def compact(self, checkpoint_id: int, committables: list[TableFile]) -> list[TableFile]:
        by_schema: dict[str, list[TableFile]] = {}
        for c in committables:
            by_schema.setdefault(c.schema_fp, []).append(c)
        out: list[TableFile] = []
        for k, group in enumerate(by_schema.values()):
            if len(group) < 2:
                out.extend(group)
                continue
            self.hook("compaction")
            if self._storage is None:
                self._storage = self.fmt.filesystem()
            fs, root = self._storage
            rows = pa.concat_tables([pq.read_table(f"{root}/{c.path}", filesystem=fs) for c in group])
            first = group[0]
            name = data_file_name(
                self.ctx.job_id, checkpoint_id, self.ctx.subtask, self.ctx.attempt, k, self._run, compacted=True
            )
            merged = write_file(
                self.fmt, fs, root, first.partition, first.partition_path, name, rows, checkpoint_id
            )
            self.hook("compaction")  # merged file written, originals still there
            for c in group:
                if c.path != merged.path:
                    fs.delete_file(f"{root}/{c.path}")
            out.append(dataclasses.replace(merged, partition_schema=first.partition_schema))
        return out
