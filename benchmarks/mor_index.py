"""Building the merge-on-read index from an existing Iceberg table (``rebuild_index=True``, or a job's first
start on a table with rows), measured against reading the same keys with pyiceberg.

Builds a ``--rows`` (default 2,000,000) row table (benchmarks/upserts.py's rows, ``--files`` appends of
consecutive ids), then ``--checkpoints`` (default 2) merge-on-read checkpoints of ``--changes`` changes each,
so the table holds position-delete files as a running job leaves it. Then, alternated over ``--rounds``
rounds (warm-up first): ``index``, the writer's index built from the table into a fresh keyed state
backend (``--backend``, RocksDB by default; one subtask owning every key group), and ``key_scan``,
pyiceberg's scan of the key column (the same live rows: data files minus their deletes).

Reports ``index_build_s`` and ``index_rows_per_s`` (medians) and ``mor_index_vs_key_scan`` (time ratio, no
target: the scan is the floor of any build that reads the table). Each built index is checked against the
table read apart from the index code: one entry per live key of the scan, and each entry's file and
position hold its key (read with pyarrow). Last line: ``RESULT {json}``.

Usage: python benchmarks/mor_index.py [--rows 2000000] [--files 10] [--changes 100000] [--checkpoints 2]
       [--backend rocksdb|hashmap] [--rounds 3] [--metric wall|cpu]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import Stopwatch, Timing, add_round_options, alternate, check_rounds, load_average, ratios  # type: ignore[import-not-found]
from sluice.sinks.iceberg.mor.positions import INDEX, file_id, unpack
from sluice.sinks.iceberg.mor.writer import rebuild_index
from sluice.state.spi import KeyBatch

from benchmarks.upsert_mor import MorJob, props_of
from benchmarks.upserts import build, change_sets
from tests.sinks.tables.helpers import Target
from tests.sinks.tables.upserts import Upserts


def deleted_positions(task: Any) -> np.ndarray:
    """The row positions of ``task``'s data file that its position-delete files name, read with pyarrow."""
    path = task.file.file_path
    found = [np.zeros(0, np.int64)]
    for d in task.delete_files:
        rows = pq.read_table(d.file_path.removeprefix("file://"), columns=["file_path", "pos"])
        paths = rows.column("file_path").to_numpy(zero_copy_only=False)
        found.append(rows.column("pos").to_numpy()[paths == path])
    return np.concatenate(found)


def check_index(job: MorJob, table: Any, scanned: pa.Table) -> None:
    """The index holds one entry per live key (counted in the state backend, not from what the build says)
    and each entry's data file holds its key at its position, a position no delete file of the table names."""
    ids = scanned.column("id").combine_chunks()
    stored = sum(len(keys) for _, keys in job.backend.encoded_keys(INDEX))
    if stored != len(ids) or job.indexed != stored:
        raise RuntimeError(f"the index holds {stored} entries (its build said {job.indexed}), the table "
                           f"{len(ids)} live rows")  # fmt: skip
    present, files, pos = unpack(job.writer.index.get(KeyBatch.of([ids], job.backend.max_parallelism)))
    if not present.all():
        raise RuntimeError(f"{int((~present).sum())} live keys have no index entry")
    keys = ids.to_numpy()
    for task in table.scan().plan_files():
        at = np.flatnonzero(files == file_id(task.file.file_path))
        if len(at):
            held = pq.read_table(task.file.file_path.removeprefix("file://"), columns=["id"]).column("id").to_numpy()
            if (pos[at] >= len(held)).any() or not np.array_equal(held[pos[at]], keys[at]):
                raise RuntimeError(f"index entries point at other rows than their keys' in {task.file.file_path}")
            if np.isin(pos[at], deleted_positions(task)).any():
                raise RuntimeError(f"index entries point at deleted rows of {task.file.file_path}")
            files[at] = 0
    if files.any():
        raise RuntimeError("index entries name data files the table does not hold")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--files", type=int, default=10)
    ap.add_argument("--changes", type=int, default=100_000)
    ap.add_argument("--checkpoints", type=int, default=2)
    ap.add_argument("--backend", choices=("hashmap", "rocksdb"), default="rocksdb")
    add_round_options(ap)
    args = ap.parse_args()
    check_rounds(args)
    root = Path(tempfile.mkdtemp(prefix="sluice-mor-index-bench-"))
    result: dict[str, Any] = {"metric": args.metric, "rounds": args.rounds, "loadavg_before": load_average()}
    try:
        up = Upserts(Target("iceberg", str(root / "lake"), {}, str(root)))
        build(up, args.rows, args.files)
        props = props_of(up.catalog())
        setup = MorJob(props, "db.events", args.backend, root)
        for cid, changes in enumerate(change_sets(args.rows, args.changes, args.checkpoints, 1.0), start=1):
            setup.checkpoint(cid, changes)
        setup.close()
        table = up.catalog().load_table("db.events")
        deletes = {d.file_path for t in table.scan().plan_files() for d in t.delete_files}
        print(f"table: {args.rows:,} rows in {args.files} appends, {args.checkpoints} merge-on-read checkpoints "
              f"({len(deletes)} delete files)", flush=True)  # fmt: skip
        entries: list[int] = []

        def run(side: str, r: int) -> Timing:
            if side == "key_scan":
                with Stopwatch() as sw:
                    table.scan(selected_fields=("id",)).to_arrow()
                return sw.timing
            job = MorJob(props, "db.events", args.backend, root, build_index=False)
            try:
                with Stopwatch() as sw:
                    job.indexed = rebuild_index(job.writer, job.committer.load(), [pa.int64()])
                check_index(job, table, table.scan(selected_fields=("id",)).to_arrow())
                entries.append(job.indexed)
            finally:
                job.close()
            return sw.timing

        timings = alternate(("index", "key_scan"), args.rounds, run, warmup=not args.no_warmup)
        build_s = statistics.median(t.of(args.metric) for t in timings["index"])
        result.update(index_build_s=round(build_s, 3), index_rows_per_s=round(entries[-1] / build_s),
                      key_scan_s=round(statistics.median(t.of(args.metric) for t in timings["key_scan"]), 3),
                      index_build_runs=[round(t.of(args.metric), 3) for t in timings["index"]])  # fmt: skip
        ratios(result, "mor_index_vs_key_scan", timings["index"], timings["key_scan"], args.metric, of="time")
        result.update(rows=args.rows, files=args.files, changes=args.changes, checkpoints=args.checkpoints,
                      delete_files=len(deletes), entries=entries[-1], backend=args.backend,
                      loadavg_after=load_average())  # fmt: skip
        print("RESULT " + json.dumps(result))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
