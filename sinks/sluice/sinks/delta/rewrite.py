"""The Delta sink's background rewrite: delta-rs ``optimize`` compaction of partitions with many small files.

Optimize commits one transaction that removes the small files (``dataChange=false``) and adds the merged
ones; delta-rs's conflict checker lets it commit alongside blind appends (the sink's checkpoint commits)
because those never touch the files it removes.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from sluice.sinks.delta.options import DeltaSinkOptions
from sluice.sinks.tables.rewrite import RewritePolicy

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


def rewrite_small_files(options: DeltaSinkOptions, policy: RewritePolicy) -> int:
    """Optimize every partition holding at least ``policy.min_files`` small files; returns files replaced."""
    from deltalake import DeltaTable
    from deltalake.transaction import CommitProperties

    table = DeltaTable(options.path, storage_options=options.delta_storage_options())
    replaced = 0
    for partition, n in small_files_by_partition(table, policy.target_size).items():
        if n < policy.min_files:
            continue
        filters = [(c, "=", v) for c, v in partition if v is not None] or None
        metrics = table.optimize.compact(
            partition_filters=filters,
            target_size=policy.target_size,
            max_concurrent_tasks=1,
            commit_properties=CommitProperties(custom_metadata={"sluice.rewrite": "small files"}),
        )
        replaced += int(metrics.get("numFilesRemoved", 0))
    return replaced
