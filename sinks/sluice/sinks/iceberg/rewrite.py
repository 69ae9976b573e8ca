"""The Iceberg sink's background rewrite: per partition, small data files merged into one and swapped in by
one overwrite snapshot (delete the small files, add the merged one; no rows change).

The slow part (reading and writing Parquet) runs without a lock; the commit step holds the committer's lock
for the few milliseconds of the catalog swap, so it never races the sink's own checkpoint commits. If a commit
landed in between and replaced some of the small files (in upsert mode each checkpoint's merge replaces the
files holding changed keys), the merged file is stale: it is deleted and the partition is planned, merged
and swapped again holding the lock from start to end (:func:`~sluice.sinks.tables.rewrite.take_turn`), so
the next checkpoint commit waits for it instead of winning again. Another writer's commit in between fails
the swap's validation or the catalog's compare-and-swap: it is tried again on the refreshed table.
"""

from __future__ import annotations

import contextlib
import functools
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
from sluice.sinks.tables.errors import RewriteLostRace
from sluice.sinks.tables.files import TableFile, write_parquet
from sluice.sinks.tables.rewrite import RewritePolicy, take_turn
from sluice.sinks.tables.storage import arrow_filesystem

__all__ = ["rewrite_small_files"]

log = logging.getLogger("sluice.sinks.iceberg")

REWRITE = "sluice.rewrite"


def rewrite_small_files(
    options: IcebergSinkOptions, policy: RewritePolicy, lock: threading.Lock, attempts: int = 5
) -> int:
    """Merge every partition holding at least ``policy.min_files`` small files; returns files replaced."""
    table = load_catalog(options).load_table(options.table)
    replaced = 0
    for part, files in _small_files(table, policy).items():
        if len(files) >= policy.min_files:
            replaced += take_turn(lock, functools.partial(_rewrite, options, policy, lock, part, files, attempts))
    return replaced


def _small_files(table: Any, policy: RewritePolicy) -> dict[tuple[int, Any], list[Any]]:
    """The live data files under ``policy.target_size``, by (spec id, partition)."""
    groups: dict[tuple[int, Any], list[Any]] = {}
    for task in table.scan().plan_files():
        f = task.file
        if f.file_size_in_bytes < policy.target_size:
            groups.setdefault((f.spec_id, f.partition), []).append(f)
    return groups


def _rewrite(
    options: IcebergSinkOptions,
    policy: RewritePolicy,
    lock: threading.Lock,
    part: tuple[int, Any],
    planned: list[Any],
    attempts: int,
    held: bool,
) -> int:
    """Merge partition ``part``'s ``planned`` small files and swap them for the merged one, taking ``lock`` for
    the swap; if the caller ``held`` the lock, plan them afresh first. Returns files replaced."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    table = load_catalog(options).load_table(options.table)
    files = _small_files(table, policy).get(part, []) if held else planned
    if len(files) < policy.min_files:
        return 0  # a merge or another rewrite left too few
    files = files[: max(policy.min_files, _fitting(files, policy.target_size))]
    location = table.location().rstrip("/")
    fs, root = arrow_filesystem(location, options.storage_options)
    stored = schema_to_pyarrow(table.schema())
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
    try:
        with contextlib.nullcontext() if held else lock:
            _swap(options, table, files, data_file(table, merged, files[0].partition), attempts)
    except BaseException:
        fs.delete_file(f"{root}/{merged_rel}")  # the swap did not land
        raise
    return len(files)


def _fitting(files: list[Any], target: int) -> int:
    total = 0
    for n, f in enumerate(files):
        total += f.file_size_in_bytes
        if total > target:
            return n
    return len(files)


def _swap(options: IcebergSinkOptions, table: Any, small: list[Any], merged: Any, attempts: int) -> None:
    """Commit the overwrite (the caller holds the lock); RewriteLostRace if a small file is gone or every
    attempt lost the catalog's compare-and-swap."""
    from pyiceberg.exceptions import CommitFailedException, ValidationException

    lost: Exception | None = None
    for _ in range(attempts):
        table.refresh()
        live = {t.file.file_path for t in table.scan().plan_files()}
        gone = [f.file_path for f in small if f.file_path not in live]
        if gone:
            raise RewriteLostRace(
                f"IcebergSink {options.table}: a commit replaced {len(gone)} of the {len(small)} small files "
                "the rewrite merged"
            )
        try:
            with (
                table.transaction() as tx,
                tx.update_snapshot(snapshot_properties={REWRITE: "small files"}).overwrite() as ow,
            ):
                for f in small:
                    ow.delete_data_file(f)
                ow.append_data_file(merged)
            return
        except (CommitFailedException, ValidationException) as exc:
            lost = exc
            log.info("IcebergSink %s: rewrite lost a race, trying again: %s", options.table, exc)
    raise RewriteLostRace(f"IcebergSink {options.table}: the rewrite's swap lost {attempts} races: {lost}")
