"""Iceberg position-delete files, written as the table spec says (pyiceberg reads them but does not write
them): Parquet with the required columns ``file_path`` (string, reserved field id 2147483546) and ``pos``
(long, 2147483545), sorted by path then position, one file per partition of the data files it names, its
DataFile carrying ``content=POSITION_DELETES`` and full (untruncated) bounds of both columns, so a reader can
tell a file-scoped delete file from one naming several data files.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile

__all__ = ["DELETE_SCHEMA", "PATH_ID", "POS_ID", "delete_file_name", "parse_delete_file_name", "read_deletes", "write_deletes"]

PATH_ID = 2147483546
POS_ID = 2147483545
DELETE_SCHEMA = pa.schema(
    [
        pa.field("file_path", pa.string(), nullable=False, metadata={b"PARQUET:field_id": str(PATH_ID).encode()}),
        pa.field("pos", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": str(POS_ID).encode()}),
    ]
)
_NAME = re.compile(r"^delete-(?P<job>.+)-(?P<ckpt>\d{8})-a\d+-\d{4,}-[0-9a-f]{12}\.parquet$")


def delete_file_name(job_id: str, checkpoint_id: int, attempt: int, seq: int, run: str) -> str:
    """The name of a position-delete file the committer writes for a checkpoint."""
    return f"delete-{job_id}-{checkpoint_id:08d}-a{attempt}-{seq:04d}-{run}.parquet"


def parse_delete_file_name(name: str) -> tuple[str, int] | None:
    """``(job id, checkpoint id)`` of a position-delete file name :func:`delete_file_name` made, else None."""
    m = _NAME.match(name.rsplit("/", 1)[-1])
    return (m["job"], int(m["ckpt"])) if m else None


def write_deletes(
    fs: pafs.FileSystem,
    root: str,
    location: str,
    rel: str,
    paths: pa.Array,
    positions: np.ndarray[Any, Any],
    spec_id: int,
    partition: Any,
    compression: str = "zstd",
) -> DataFile:
    """Write the position deletes ``(paths[i], positions[i])`` as the file ``rel`` of the table at ``location``
    (``root`` in ``fs``) and return its DataFile (``partition``: the data files' partition Record)."""
    from pyiceberg.conversions import to_bytes
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.types import LongType, StringType

    rows = pa.table([paths.cast(pa.string()), pa.array(positions, pa.int64())], schema=DELETE_SCHEMA)
    rows = rows.sort_by([("file_path", "ascending"), ("pos", "ascending")])
    full = f"{root}/{rel}"
    if isinstance(fs, pafs.LocalFileSystem):
        fs.create_dir(full.rsplit("/", 1)[0], recursive=True)
    collector: list[pq.FileMetaData] = []
    with fs.open_output_stream(full) as out:
        pq.write_table(rows, out, compression=compression, metadata_collector=collector)
    meta = collector[0]
    sizes = {PATH_ID: 0, POS_ID: 0}
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        sizes[PATH_ID] += group.column(0).total_compressed_size
        sizes[POS_ID] += group.column(1).total_compressed_size
    n = rows.num_rows
    path_col, pos_col = rows.column("file_path"), rows.column("pos")
    bounds = pc.min_max(pos_col)
    first, last = path_col[0].as_py(), path_col[n - 1].as_py()
    df = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=f"{location}/{rel}",
        file_format=FileFormat.PARQUET,
        partition=partition,
        record_count=n,
        file_size_in_bytes=int(fs.get_file_info(full).size or 0),
        column_sizes=sizes,
        value_counts={PATH_ID: n, POS_ID: n},
        null_value_counts={PATH_ID: 0, POS_ID: 0},
        lower_bounds={PATH_ID: to_bytes(StringType(), first), POS_ID: to_bytes(LongType(), bounds["min"].as_py())},
        upper_bounds={PATH_ID: to_bytes(StringType(), last), POS_ID: to_bytes(LongType(), bounds["max"].as_py())},
        sort_order_id=None,
        spec_id=spec_id,
        equality_ids=None,
        key_metadata=None,
    )
    df.spec_id = spec_id  # not a field of the struct from_args binds
    return df


def read_deletes(fs: pafs.FileSystem, path: str) -> pa.Table:
    """A position-delete file's ``file_path`` and ``pos`` columns (``path`` in ``fs``)."""
    return pq.read_table(path, filesystem=fs, columns=["file_path", "pos"])
