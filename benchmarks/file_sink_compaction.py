"""Benchmark: generator -> FileSink(Parquet) with checkpoints every second, without and with compaction.

Runs the same unbounded job twice for ``--seconds`` each (cancelled at the end), counts the files and rows
readers can see, and reports files written, mean file size and throughput of each run and the throughput
cost of compaction. The last line is ``RESULT {json}``.

    python benchmarks/file_sink_compaction.py --seconds 60
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from typing import Any

import pyarrow.compute as pc
import pyarrow.dataset as ds
from sluice import CheckpointConfig, Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.sinks.files import CompactionPolicy, FileSink, RollingPolicy


def run(seconds: float, compaction: bool, args: argparse.Namespace) -> dict[str, Any]:
    d = tempfile.mkdtemp(prefix="sluice-bench-")
    try:
        root = os.path.join(d, "out")
        p = Pipeline(
            f"bench-{'c' if compaction else 'nc'}",
            parallelism=args.parallelism,
            checkpoint=CheckpointConfig(interval=1.0, storage=os.path.join(d, "chk")),
        )
        src = GeneratorSource(
            num_splits=args.parallelism, records_per_split=None, batch_size=args.batch_size, num_keys=1000
        )
        sink = FileSink(
            root,
            format="parquet",
            bucket_by=["bucket"],
            rolling=RollingPolicy(max_size=args.roll_bytes),
            compaction=CompactionPolicy(target_size=args.target_bytes) if compaction else None,
        )
        p.source(src).map_batches(
            lambda b: b.append_column("bucket", pc.bit_wise_and(b.column("key"), 3))
        ).sink(sink)
        t0 = time.perf_counter()
        job = p.start(runtime="local", restore="none")
        time.sleep(seconds)
        result = job.cancel()
        elapsed = time.perf_counter() - t0
        dataset = ds.dataset(root, format="parquet", partitioning="hive")
        sizes = [os.path.getsize(f) for f in dataset.files]
        rows = dataset.count_rows()
        return {
            "compaction": compaction,
            "seconds": round(elapsed, 2),
            "checkpoints": result.last_checkpoint,
            "files_staged": result.metrics.get("files_staged", 0),
            "files_visible": len(sizes),
            "mean_file_bytes": int(sum(sizes) / len(sizes)) if sizes else 0,
            "rows_committed": rows,
            "rows_per_s": round(rows / elapsed),
            "mb_per_s": round(sum(sizes) / elapsed / 1e6, 3),
        }
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0, help="duration of each run (default 60)")
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=2000)
    ap.add_argument("--roll-bytes", type=int, default=256 * 1024, help="rolling max_size (small files)")
    ap.add_argument("--target-bytes", type=int, default=64 << 20, help="compaction target_size")
    args = ap.parse_args()
    plain = run(args.seconds, False, args)
    compacted = run(args.seconds, True, args)
    for r in (plain, compacted):
        print(
            f"compaction={r['compaction']!s:5}  files={r['files_visible']:5d} (staged {r['files_staged']})  "
            f"mean={r['mean_file_bytes'] / 1024:9.1f} KiB  rows/s={r['rows_per_s']:9d}  MB/s={r['mb_per_s']}"
        )
    cost = 1 - compacted["rows_per_s"] / plain["rows_per_s"] if plain["rows_per_s"] else None
    print(f"throughput cost of compaction: {cost:.1%}" if cost is not None else "no rows committed")
    print(
        "RESULT "
        + json.dumps(
            {
                "without": plain,
                "with": compacted,
                "compaction_throughput_cost": round(cost, 4) if cost is not None else None,
            }
        )
    )


if __name__ == "__main__":
    main()
