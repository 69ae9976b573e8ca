"""The Iceberg sink's background rewrite: per partition, small data files merged into one and swapped in by
one overwrite snapshot (delete the small files, add the merged one; no rows change).

The slow part (reading and writing Parquet) runs without a lock; the commit step holds the committer's lock
for the few milliseconds of the catalog swap, so it never races the sink's own checkpoint commits. A commit
by another writer in between makes the swap fail validation or the catalog's compare-and-swap: it is tried
again on the refreshed table, and if the small files are gone the merged file is deleted and nothing changes.
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from sluice.sinks.iceberg.catalog import load_catalog
from sluice.sinks.iceberg.layout import data_file, file_stats
from sluice.sinks.iceberg.merge import conform
from sluice.sinks.iceberg.options import IcebergSinkOptions
from sluice.sinks.tables.files import TableFile, write_parquet
from sluice.sinks.tables.rewrite import RewritePolicy
from sluice.sinks.tables.storage import arrow_filesystem

__all__ = ["rewrite_small_files"]

log = logging.getLogger("sluice.sinks.iceberg")

REWRITE = "sluice.rewrite"


def rewrite_small_files(
    options: IcebergSinkOptions, policy: RewritePolicy, lock: threading.Lock, attempts: int = 5
) -> int:
    """Merge every partition holding at least ``policy.min_files`` small files; returns files replaced."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    table = load_catalog(options).load_table(options.table)
    groups: dict[tuple[int, Any], list[Any]] = {}
    for task in table.scan().plan_files():
        f = task.file
        if f.file_size_in_bytes < policy.target_size:
            groups.setdefault((f.spec_id, f.partition), []).append(f)
    location = table.location().rstrip("/")
    fs, root = arrow_filesystem(location, options.storage_options)
    stored = schema_to_pyarrow(table.schema())
    replaced = 0
    for files in groups.values():
        if len(files) < policy.min_files:
            continue
        files = files[: max(policy.min_files, _fitting(files, policy.target_size))]
        rel = [f.file_path[len(location) + 1 :] for f in files]
        # files written before a column was added, by a merge or by another writer differ in columns, field
        # metadata or nullability: each is read as the table's current schema
        rows = pa.concat_tables([conform(pq.read_table(f"{root}/{r}", filesystem=fs), stored) for r in rel])
        merged_rel = f"{rel[0].rsplit('/', 1)[0]}/rewrite-{uuid.uuid4().hex}.parquet"
        meta = write_parquet(fs, f"{root}/{merged_rel}", rows, options.compression)
        merged = TableFile(
            merged_rel,
            fs.get_file_info(f"{root}/{merged_rel}").size,
            rows.num_rows,
            (),
            "",
            0,
            rows.schema,
            {**file_stats(table, meta), "spec_id": files[0].spec_id},
        )
        if _swap(options, table, files, data_file(table, merged, files[0].partition), lock, attempts):
            replaced += len(files)
        else:
            fs.delete_file(f"{root}/{merged_rel}")
    return replaced


def _fitting(files: list[Any], target: int) -> int:
    total = 0
    for n, f in enumerate(files):
        total += f.file_size_in_bytes
        if total > target:
            return n
    return len(files)


def _swap(
    options: IcebergSinkOptions, table: Any, small: list[Any], merged: Any, lock: threading.Lock, attempts: int
) -> bool:
    from pyiceberg.exceptions import CommitFailedException, ValidationException

    for _ in range(attempts):
        with lock:
            table.refresh()
            live = {t.file.file_path for t in table.scan().plan_files()}
            if not all(f.file_path in live for f in small):
                return False  # another rewrite took them
            try:
                with (
                    table.transaction() as tx,
                    tx.update_snapshot(snapshot_properties={REWRITE: "small files"}).overwrite() as ow,
                ):
                    for f in small:
                        ow.delete_data_file(f)
                    ow.append_data_file(merged)
                return True
            except (CommitFailedException, ValidationException) as exc:
                log.info("IcebergSink %s: rewrite lost a race, trying again: %s", options.table, exc)
    return False
