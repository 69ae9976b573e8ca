"""Iceberg merge-on-read upserts, driven as the sink drives them (used by benchmarks/upserts.py).

A merge-on-read checkpoint is the writer's pre-commit (collapse, index look-ups, the new rows as data files,
the old positions staged) plus the global commit (position-delete files, one row-delta snapshot). Both are
timed here, as one checkpoint's cost: a copy-on-write checkpoint's writer only stages its changes, so the
comparison counts more work on the merge-on-read side, never less. The writer runs in this process on a
keyed state backend of its own (``--mor-backend``: the index of every key of the table); its index is built
from the table first (``rebuild_index``), untimed, as a job starting on an existing table builds it once.

``mor_side``: one side of the alternated rounds of benchmarks/upserts.py (each side applies the same
checkpoint's changes to its own copy of one table). ``read_cost``: a full scan (pyiceberg) after
``--read-checkpoints`` merge-on-read checkpoints, before and after one background rewrite round (which folds
the deletes into the data files), each scan checked against the replay of the changes.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
from sluice.sinks.iceberg import IcebergSink
from sluice.sinks.iceberg.mor.committer import MergeOnReadCommitter
from sluice.sinks.iceberg.mor.rewrite import fold_deletes
from sluice.sinks.iceberg.mor.writer import MergeOnReadWriter, rebuild_index
from sluice.sinks.tables.rewrite import RewritePolicy
from sluice.state.config import StateBackendConfig
from sluice.state.factory import state_backend_for
from sluice.state.keygroups import KeyGroupRange
from sluice.state.spi import KeyedStateBackend
from sluice.state.transfer import LocalFileTransfer

MAX_PARALLELISM = 128


class _Ctx:
    """The writer's subtask (one, owning every key group) and the committer's job, as the runtime gives them."""

    subtask, parallelism, attempt = 0, 1, 0
    job_id, sink_uid = "bench", "sink"
    restored_checkpoint_id: int | None = None

    def __init__(self, backend: KeyedStateBackend) -> None:
        self._backend = backend
        self.metrics: dict[str, int] = {}

    def metric(self, name: str, increment: int = 1) -> None:
        self.metrics[name] = self.metrics.get(name, 0) + increment

    def gauge(self, name: str, value: float) -> None:
        pass

    def fault_hook(self, point: str) -> None:
        pass

    def keyed_state(self) -> KeyedStateBackend:
        return self._backend


class MorJob:
    """A merge-on-read writer and committer of table ``name`` (one subtask), its index built from the table
    (unless not ``build_index``)."""

    def __init__(self, props: dict[str, str], name: str, backend: str, work: Path,
                 rewrite: RewritePolicy | None = None, build_index: bool = True) -> None:  # fmt: skip
        sink = IcebergSink(name, catalog_properties=props, mode="upsert", key_columns=["id"],
                           write_mode="merge-on-read", rebuild_index=True, rewrite=rewrite)  # fmt: skip
        self.backend = state_backend_for(StateBackendConfig(type=backend)).create_keyed_backend(
            "bench", KeyGroupRange(0, MAX_PARALLELISM), MAX_PARALLELISM,
            LocalFileTransfer(tempfile.mkdtemp(dir=work)), None,
        )  # fmt: skip
        self.ctx = _Ctx(self.backend)
        self.writer = MergeOnReadWriter(sink.options, self.ctx)
        self.committer = MergeOnReadCommitter(sink.options, self.ctx)
        t0 = time.perf_counter()
        self.indexed = rebuild_index(self.writer, self.committer.load(), [pa.int64()]) if build_index else 0
        self.index_s = time.perf_counter() - t0
        self.writer._rebuild = False
        self.write_s = self.commit_s = 0.0

    def checkpoint(self, cid: int, changes: pa.Table) -> None:
        """One checkpoint: the changes written, the writer's pre-commit and the commit (timed apart)."""
        for batch in changes.to_batches():
            self.writer.write(batch)
        t0 = time.perf_counter()
        files = self.writer.prepare_commit(cid)
        t1 = time.perf_counter()
        outcome = self.committer.commit(cid, files)
        self.write_s, self.commit_s = t1 - t0, time.perf_counter() - t1
        assert outcome.value == "committed", outcome

    def close(self) -> None:
        self.committer.close()
        self.backend.dispose()


def props_of(catalog: Any) -> dict[str, str]:
    return {"uri": catalog.properties["uri"], "warehouse": catalog.properties["warehouse"]}


def read_cost(up: Any, backend: str, sets: list[pa.Table], expected: list[pa.Table], scans: int,
              check: Any) -> dict[str, Any]:  # fmt: skip
    """A full scan after ``len(sets)`` merge-on-read checkpoints, before and after one rewrite round."""
    work = Path(up.target.catalog_dir)
    policy = RewritePolicy(every=1_000_000, min_files=2)
    job = MorJob(props_of(up.catalog()), "db.events", backend, work, rewrite=policy)
    try:
        commits = []
        for cid, changes in enumerate(sets, start=1):
            job.checkpoint(cid, changes)
            commits.append(round(job.write_s + job.commit_s, 3))
        table = job.committer.load()

        def scan(label: str) -> tuple[float, int]:
            times, rows = [], 0
            for _ in range(scans):
                t0 = time.perf_counter()
                got = job.committer.load().scan().to_arrow()
                times.append(time.perf_counter() - t0)
                rows = got.num_rows
            check(label, got, expected[-1])
            return statistics.median(times), rows

        deletes = sum(len(t.delete_files) for t in table.scan().plan_files())
        files = len(list(table.scan().plan_files()))
        before, rows = scan(f"merge-on-read after {len(sets)} checkpoints")
        t0 = time.perf_counter()
        replaced = fold_deletes(job.committer, policy)
        rewrite_s = time.perf_counter() - t0
        after_table = job.committer.load()
        after, _ = scan("merge-on-read after a rewrite round")
        return {
            "checkpoints": len(sets), "checkpoint_s": commits, "rows": rows,
            "data_files_before": files, "delete_files_read_before": deletes,
            "data_files_after": len(list(after_table.scan().plan_files())),
            "delete_files_read_after": sum(len(t.delete_files) for t in after_table.scan().plan_files()),
            "scan_before_s": round(before, 3), "scan_after_s": round(after, 3),
            "rewrite_s": round(rewrite_s, 2), "files_rewritten": replaced,
        }  # fmt: skip
    finally:
        job.close()
