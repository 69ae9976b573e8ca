"""Data files a table sink writes at pre-commit: their names, what the checkpoint records about them, and how
a batch is split by partition.

Names (relative to the table's data root, ``/``-separated)::

    <partition path>/part-<job>-<ckpt>-<subtask>-a<attempt>-<seq>-<run>.parquet     written by a writer subtask
    <partition path>/part-<job>-<ckpt>-c<subtask>-a<attempt>-<seq>-<run>.parquet    merged by a compactor subtask

A file is invisible until a table commit names it. The name carries the job and the checkpoint whose
pre-commit wrote it, so ``Sink.recover`` finds files of checkpoints that never completed, and ``<run>``, a
random token of the writer or compactor instance (as Flink's FileSink puts a UUID in every part file): no
two runs, nor two attempts, ever pick the same name, so nothing overwrites a file another run committed,
even when checkpoint ids start again (wiped checkpoint storage). A restore re-commits the files the
restored checkpoint names, under those names. (Names without ``<run>``, of older versions, still parse.)
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

__all__ = [
    "TableFile",
    "data_file_name",
    "parse_data_file_name",
    "run_token",
    "schema_fingerprint",
    "split_by",
    "write_parquet",
]

_NAME = re.compile(
    r"^part-(?P<job>.+)-(?P<ckpt>\d{8})-(?P<sub>c?\d{3})-a(?P<attempt>\d+)-(?P<seq>\d{3,})"
    r"(?:-(?P<run>[0-9a-f]{12}))?\.parquet$"
)


@dataclass(frozen=True)
class TableFile:
    """A Parquet data file written at pre-commit and not yet committed. Picklable; goes into the checkpoint.

    Attributes:
        path: the file's path relative to the table root, ``/``-separated, as stored.
        size: bytes.
        rows: rows.
        partition: (partition column or field, value) pairs; ``()`` for an unpartitioned table.
        partition_path: the partition's relative directory (``""`` for none): the compactor's key.
        checkpoint_id: the checkpoint whose pre-commit wrote (or whose compaction merged) it.
        schema: the file's Arrow schema.
        stats: format-specific column statistics (Delta: the add action's stats JSON; Iceberg: the data
            file's serialized metrics).
        partition_schema: the stream's partition columns (Delta leaves them out of the files).
    """

    path: str
    size: int
    rows: int
    partition: tuple[tuple[str, Any], ...]
    partition_path: str
    checkpoint_id: int
    schema: pa.Schema
    stats: Any = None
    partition_schema: pa.Schema = field(default_factory=lambda: pa.schema([]))

    @property
    def schema_fp(self) -> str:
        return schema_fingerprint(self.schema)


def run_token() -> str:
    """A new random token for the data file names of one writer or compactor instance."""
    return uuid.uuid4().hex[:12]


def data_file_name(
    job_id: str, checkpoint_id: int, subtask: int, attempt: int, seq: int, run: str, compacted: bool = False
) -> str:
    """The file name of a data file (see the module docstring); ``run`` from :func:`run_token`."""
    sub = f"c{subtask:03d}" if compacted else f"{subtask:03d}"
    return f"part-{job_id}-{checkpoint_id:08d}-{sub}-a{attempt}-{seq:03d}-{run}.parquet"


def parse_data_file_name(name: str) -> tuple[str, int] | None:
    """``(job id, checkpoint id)`` of a data file name this module made, else None."""
    m = _NAME.match(name.rsplit("/", 1)[-1])
    return (m.group("job"), int(m.group("ckpt"))) if m else None


def data_file_attempt(name: str) -> int | None:
    """The attempt that wrote a data file this module named, else None."""
    m = _NAME.match(name.rsplit("/", 1)[-1])
    return int(m.group("attempt")) if m else None


def schema_fingerprint(schema: pa.Schema) -> str:
    return hashlib.sha1(str(schema.remove_metadata()).encode()).hexdigest()[:12]


def split_by(
    table: pa.Table, keys: Sequence[pa.Array | pa.ChunkedArray]
) -> list[tuple[tuple[Any, ...], pa.Table]]:
    """Rows of ``table`` grouped by the values of ``keys`` (arrays as long as the table), in first-seen order."""
    if not keys:
        return [((), table)]
    names = [f"k{i}" for i in range(len(keys))]
    idx = pa.table([*keys, pa.array(range(table.num_rows), pa.int64())], names=[*names, "i"])
    groups = idx.group_by(names, use_threads=False).aggregate([("i", "list")])
    cols = [groups.column(n).to_pylist() for n in names]
    rows = groups.column("i_list").to_pylist()
    return [
        (tuple(c[g] for c in cols), table.take(pa.array(rows[g], pa.int64()))) for g in range(groups.num_rows)
    ]


def write_parquet(
    fs: pafs.FileSystem,
    path: str,
    table: pa.Table,
    compression: str = "snappy",
    row_group_size: int = 1 << 20,
) -> pq.FileMetaData:
    """Write ``table`` to ``path`` in ``fs`` (parent directories created) and return the file's footer."""
    parent = path.rsplit("/", 1)[0]
    if isinstance(fs, pafs.LocalFileSystem):
        fs.create_dir(parent, recursive=True)
    collector: list[pq.FileMetaData] = []
    with fs.open_output_stream(path) as out:
        pq.write_table(
            table, out, compression=compression, row_group_size=row_group_size, metadata_collector=collector
        )
    return collector[0]
