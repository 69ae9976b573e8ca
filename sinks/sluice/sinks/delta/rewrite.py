"""The Delta sink's background rewrite: delta-rs ``optimize`` compaction of partitions with many small files.

Optimize commits one transaction that removes the small files (``dataChange=false``) and adds the merged
ones; delta-rs's conflict checker lets it commit alongside blind appends (the sink's checkpoint commits in
append mode) because those never touch the files it removes. An upsert's merge does remove files (those
holding changed keys), and if one landed after optimize read the table, optimize's commit fails ("a
concurrent transaction deleted data this operation read"): the partition is then compacted again holding
the lock the merges take (:func:`~sluice.sinks.tables.rewrite.take_turn`), so the next merge waits for it.
"""

from __future__ import annotations

import functools
import threading
from collections import Counter
from typing import Any

from sluice.sinks.delta.options import DeltaSinkOptions
from sluice.sinks.tables.errors import RewriteLostRace
from sluice.sinks.tables.rewrite import RewritePolicy, take_turn

__all__ = ["rewrite_small_files", "small_files_by_partition"]


def small_files_by_partition(table: Any, target_size: int) -> Counter[tuple[tuple[str, str | None], ...]]:
    """How many active files under ``target_size`` each partition holds."""
    actions = table.get_add_actions(flatten=True)
    import pyarrow as pa

    actions = pa.table(actions)
    parts = [c for c in actions.column_names if c.startswith("partition.")]
    sizes = actions.column("size_bytes").to_pylist()
    values = [actions.column(c).to_pylist() for c in parts]
    out: Counter[tuple[tuple[str, str | None], ...]] = Counter()
    for i, size in enumerate(sizes):
        if size < target_size:
            key = tuple(
                (c.removeprefix("partition."), None if v[i] is None else str(v[i]))
                for c, v in zip(parts, values, strict=True)
            )
            out[key] += 1
    return out


def rewrite_small_files(options: DeltaSinkOptions, policy: RewritePolicy, lock: threading.Lock | None = None) -> int:
    """Optimize every partition holding at least ``policy.min_files`` small files; returns files replaced.

    ``lock``: taken by the sink's merges; a partition whose optimize lost a race to one is compacted again
    holding it (without a lock the lost race is raised)."""
    from deltalake import DeltaTable

    table = DeltaTable(options.path, storage_options=options.delta_storage_options())
    replaced = 0
    for partition, n in small_files_by_partition(table, policy.target_size).items():
        if n >= policy.min_files:
            replaced += take_turn(lock, functools.partial(_compact, options, policy, partition))
    return replaced


def _compact(options: DeltaSinkOptions, policy: RewritePolicy, partition: tuple[tuple[str, str | None], ...], held: bool) -> int:
    """Optimize ``partition`` (counted afresh if the caller ``held`` the lock); RewriteLostRace if a commit that
    removed files it read landed first."""
    from deltalake import DeltaTable
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import CommitProperties

    table = DeltaTable(options.path, storage_options=options.delta_storage_options())
    if held and small_files_by_partition(table, policy.target_size).get(partition, 0) < policy.min_files:
        return 0  # a merge or another rewrite left too few
    filters = [(c, "=", v) for c, v in partition if v is not None] or None
    try:
        metrics = table.optimize.compact(
            partition_filters=filters,
            target_size=policy.target_size,
            max_concurrent_tasks=1,
            commit_properties=CommitProperties(custom_metadata={"sluice.rewrite": "small files"}),
        )
    except CommitFailedError as exc:
        if held:
            raise  # another writer's commit: the next round tries again
        raise RewriteLostRace(f"DeltaSink {options.path}: the rewrite's optimize lost a race: {exc}") from exc
    return int(metrics.get("numFilesRemoved", 0))
