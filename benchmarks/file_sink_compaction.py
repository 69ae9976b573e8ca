"""Benchmark: generator -> FileSink(Parquet) with checkpoints every second, without and with compaction.

Runs the same unbounded job (``--parallelism`` generator splits -> a ``bucket`` column of 4 values ->
``FileSink(parquet, bucket_by=["bucket"])`` rolling small files) without and with ``CompactionPolicy``, each
for ``--seconds`` and then stopped with a last checkpoint (``stop(savepoint=False)``: its sinks commit it),
timed from its start to that stop's return (the last commit visible).

The metric is named before the run (``--metric``: rows committed per wall-clock second by default; per
CPU-second of the whole process tree printed beside). The two sides run in alternated rounds (``--rounds``,
at least 3, the order rotated) after an untimed, shorter warm-up of each (benchmarks/_common.py).
``compaction_vs_plain`` is the median of the per-round ratios of the compacted job's rate to the plain
one's, printed with every round and the spread; ``compaction_throughput_cost`` is ``1 - `` each round's
ratio (its median, runs and spread). Every run's output is read back (the files readers see) and checked
against the generator's formula: each split's rows are its first rows, none twice, none missing, every
column right for its ``id``. Files visible and their mean size per run are reported beside. Last line:
``RESULT {json}`` (``without``, ``with``: the median run of each side; ``compaction_throughput_cost`` with
``_runs`` and ``_spread``).

    python benchmarks/file_sink_compaction.py [--quick] [--seconds 30] [--rounds 3] [--metric wall|cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.dataset as ds

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _checks import check_generator_output  # type: ignore[import-not-found]
from _common import Stopwatch, add_round_options, alternate, check_rounds, load_average, report  # type: ignore[import-not-found]
from sluice import CheckpointConfig, Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.sinks.files import CompactionPolicy, FileSink, RollingPolicy

SIDES = ("without", "with")
KEYS = 1000


def run(seconds: float, compaction: bool, args: argparse.Namespace) -> dict[str, Any]:
    d = tempfile.mkdtemp(prefix="sluice-bench-")
    try:
        root = os.path.join(d, "out")
        p = Pipeline(f"bench-{'c' if compaction else 'nc'}", parallelism=args.parallelism,
                     checkpoint=CheckpointConfig(interval=1.0, storage=os.path.join(d, "chk")))  # fmt: skip
        src = GeneratorSource(num_splits=args.parallelism, records_per_split=None, batch_size=args.batch_size,
                              num_keys=KEYS)  # fmt: skip
        sink = FileSink(root, format="parquet", bucket_by=["bucket"], rolling=RollingPolicy(max_size=args.roll_bytes),
                        compaction=CompactionPolicy(target_size=args.target_bytes) if compaction else None)  # fmt: skip
        p.source(src).map_batches(lambda b: b.append_column("bucket", pc.bit_wise_and(b.column("key"), 3))).sink(sink)
        with Stopwatch() as sw:
            job = p.start(runtime="local", restore="none")
            time.sleep(seconds)
            result = job.stop(savepoint=False)
        dataset = ds.dataset(root, format="parquet", partitioning="hive")
        sizes = [os.path.getsize(f) for f in dataset.files]
        table = dataset.to_table()
        checked = check_generator_output(table, args.parallelism, KEYS, label=f"compaction={compaction}")
        bucket = pc.cast(table.column("bucket"), "int64")
        if not checked["rows"] or not pc.all(pc.equal(bucket, pc.bit_wise_and(table.column("key"), 3))).as_py():
            raise RuntimeError(f"compaction={compaction}: no rows, or a bucket column that is not key & 3")
        rows, t = checked["rows"], sw.timing
        return {
            "compaction": compaction,
            "seconds": round(t.wall, 2),
            "cpu_s": round(t.cpu, 2),
            "checkpoints": result.last_checkpoint,
            "files_staged": result.metrics.get("files_staged", 0),
            "files_visible": len(sizes),
            "mean_file_bytes": int(sum(sizes) / len(sizes)) if sizes else 0,
            "rows_committed": rows,
            "rows_per_s": round(rows / t.wall),
            "rows_per_cpu_s": round(rows / t.cpu),
            "mb_per_s": round(sum(sizes) / t.wall / 1e6, 3),
        }
    finally:
        shutil.rmtree(d, ignore_errors=True)


def show(r: dict[str, Any]) -> str:
    return (f"files={r['files_visible']:5d} (staged {r['files_staged']})  mean={r['mean_file_bytes'] / 1024:9.1f} KiB  "
            f"rows/s={r['rows_per_s']:9d}  rows/CPU-s={r['rows_per_cpu_s']:9d}  ({r['rows_committed']:,} rows checked)")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="10 s per run")
    ap.add_argument("--seconds", type=float, default=30.0, help="duration of each run (default 30)")
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=2000)
    ap.add_argument("--roll-bytes", type=int, default=256 * 1024, help="rolling max_size (small files)")
    ap.add_argument("--target-bytes", type=int, default=64 << 20, help="compaction target_size")
    add_round_options(ap)
    args = ap.parse_args()
    if args.quick:
        args.seconds = 10.0
    check_rounds(args)
    out: dict[str, Any] = {"seconds": args.seconds, "parallelism": args.parallelism, "metric": args.metric,
                           "rounds": args.rounds, "loadavg_before": load_average()}  # fmt: skip
    runs = alternate(SIDES, args.rounds, lambda side, r: run(args.seconds if r else min(args.seconds, 5.0), side == "with", args),
                     warmup=not args.no_warmup, show=show)  # fmt: skip
    rate = {"wall": "rows_per_s", "cpu": "rows_per_cpu_s"}
    for m in (args.metric, *(x for x in ("wall", "cpu") if x != args.metric)):
        per_round = [c[rate[m]] / p[rate[m]] for c, p in zip(runs["with"], runs["without"], strict=True)]
        suffix = "" if m == args.metric else f"_{m}"
        report(out, f"compaction_vs_plain{suffix}", per_round)
        report(out, f"compaction_throughput_cost{suffix}", [1 - x for x in per_round], digits=4)
    for side in SIDES:  # the run of the median rate, and every run
        ordered = sorted(runs[side], key=lambda r: r["rows_per_s"])
        out[side] = ordered[len(ordered) // 2]
        out[f"{side}_runs"] = runs[side]
    out["files_visible_ratio"] = round(statistics.median(
        p["files_visible"] / max(1, c["files_visible"]) for c, p in zip(runs["with"], runs["without"], strict=True)), 2)  # fmt: skip
    out["loadavg_after"] = load_average()
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
