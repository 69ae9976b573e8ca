"""Checkpoint overhead on the in-process runtime.

1. ``throughput_ratio``: records per second of the same keyed job (generator -> map_batches -> filter ->
   key_by -> keyed running sum -> FileSink(parquet), parallelism 2) with a checkpoint every 1 s against
   none. The metric is named before the run (``--metric``: wall time by default, CPU time of the whole
   process tree printed beside); the two sides run in alternated rounds (``--rounds``, at least 3, the
   order rotated) after an untimed warm-up of each (benchmarks/_common.py), each timed from its start to
   its end (``run()`` returns after the last commit); the ratio is the median of the per-round ratios,
   printed with every round and the spread (min-max). Target: >= 0.9 (checkpoints cost under 10%). Every
   run's output is read back and checked against the input: the last running sum of each key must be
   the sum of that key's ``value`` over the generator's rows (recomputed from its formula).
2. How long a task is blocked per checkpoint (the synchronous part: pre-barrier flush + copy-on-write
   freeze + barrier forwarding) with 10k / 100k / 1M keys of keyed state, next to the asynchronous part
   (serialization and upload, which does not block processing): one run per size, from the checkpoint
   statistics (not a comparison).

Usage: python benchmarks/checkpoint_overhead.py [--quick] [--rows N] [--rounds 3] [--metric wall|cpu]
       [--keys 10000,100000,1000000]
Last line: RESULT {json}
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # type: ignore[import-not-found]
    CountSink,
    Stopwatch,
    Timing,
    add_round_options,
    alternate,
    check_rounds,
    load_average,
    ratios,
    with_runs,
)
from sluice import CheckpointConfig, KeyedProcessFunction, Pipeline, ValueStateDescriptor
from sluice.connectors.generator import GeneratorSource
from sluice.sinks.files import FileSink

SPLITS, KEYS = 4, 64
SIDES = ("no_checkpoints", "checkpoint_1s")


class Sum(KeyedProcessFunction):
    """The running sum of ``value`` per key, emitted once per batch of the key."""

    def open(self, ctx: Any) -> None:
        self.d = ValueStateDescriptor("sum", 0)

    def process(self, key: Any, rows: pa.RecordBatch, ctx: Any) -> Any:
        st = ctx.state(self.d)
        total = st.value() + pc.sum(rows.column("value")).as_py()
        st.update(total)
        return [{"key": key, "sum": total}]


def vectorized_job(rows: int, interval: float | None, d: str) -> Pipeline:
    p = Pipeline("overhead", parallelism=2, checkpoint=CheckpointConfig(interval=interval, storage=f"{d}/chk"))
    src = GeneratorSource(num_splits=SPLITS, records_per_split=rows // SPLITS, batch_size=5000, num_keys=KEYS)
    s = p.source(src).map_batches(lambda b: b.append_column("v2", pc.multiply(b.column("value"), 2)))
    s.filter(pc.field("v2") >= 0).key_by("key").process(Sum()).sink(FileSink(f"{d}/out", format="parquet"))
    return p


def expected_sums(rows: int) -> np.ndarray:
    """Sum of ``value`` per key over the generator's rows, from its formula (``id`` 0..rows-1, ``key = id %
    KEYS``, ``value = id * 7 % 1000``)."""
    ids = np.arange(rows // SPLITS * SPLITS, dtype=np.int64)
    return np.bincount(ids % KEYS, weights=ids * 7 % 1000, minlength=KEYS).astype(np.int64)


def check(label: str, out: str, expected: np.ndarray) -> None:
    got = ds.dataset(out, format="parquet").to_table().group_by("key").aggregate([("sum", "max")])
    sums = np.zeros(KEYS, np.int64)
    sums[got.column("key").to_numpy()] = got.column("sum_max").to_numpy()
    if got.num_rows != KEYS or not np.array_equal(sums, expected):
        raise RuntimeError(f"{label}: the per-key sums differ from the input's ({got.num_rows} keys)")


def throughput(rows: int, interval: float | None, expected: np.ndarray, label: str) -> Timing:
    with tempfile.TemporaryDirectory() as d:
        with Stopwatch() as sw:
            vectorized_job(rows, interval, d).run(runtime="local", restore="none")
        check(label, f"{d}/out", expected)
        return sw.timing


def blocked_per_checkpoint(keys: int) -> dict[str, float]:
    """A fast source fills ``keys`` keys of state, a slow one keeps the job running for ~6 s of checkpoints."""
    with tempfile.TemporaryDirectory() as d:
        p = Pipeline("state", checkpoint=CheckpointConfig(interval=0.5, storage=f"{d}/chk"))
        fill = GeneratorSource(num_splits=1, records_per_split=keys, batch_size=20_000, num_keys=keys, name="fill")
        tick = GeneratorSource(num_splits=1, records_per_split=600, batch_size=10, num_keys=10,
                               rows_per_second=100, name="tick")  # fmt: skip
        p.source(fill).union(p.source(tick)).key_by("key").process(Sum(), name="sum").sink(CountSink())
        result = p.run(runtime="local", restore="none")
    samples = [
        t
        for s in result.checkpoints
        if s.status == "completed"
        for t in s.tasks.values()
        if t and t.get("state_bytes", 0) > keys * 4
    ]
    return {
        "checkpoints": len(samples),
        "blocked_ms_median": 1000 * statistics.median(t["sync_s"] for t in samples),
        "blocked_ms_max": 1000 * max(t["sync_s"] for t in samples),
        "async_ms_median": 1000 * statistics.median(t["async_s"] for t in samples),
        "state_mb": max(t["state_bytes"] for t in samples) / 2**20,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="400k rows, keys 10000,100000")
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--keys", default="10000,100000,1000000")
    add_round_options(ap)
    args = ap.parse_args()
    if args.quick:
        args.rows, args.keys = 400_000, "10000,100000"
    check_rounds(args)
    out: dict[str, Any] = {"rows": args.rows, "metric": args.metric, "rounds": args.rounds,
                           "loadavg_before": load_average()}  # fmt: skip
    expected = expected_sums(args.rows)
    work = args.rows // SPLITS * SPLITS

    def run(side: str, r: int) -> Timing:
        n = work // 10 if r == 0 else work  # the warm-up: a tenth of the rows
        return throughput(n, 1.0 if side == "checkpoint_1s" else None, expected_sums(n) if r == 0 else expected,
                          f"{side}, round {r}")  # fmt: skip

    timings = alternate(SIDES, args.rounds, run, warmup=not args.no_warmup)
    for side, ts in timings.items():
        print(f"  {side}: {', '.join(f'{work / t.wall:,.0f}' for t in ts)} rec/s", flush=True)
    ratios(out, "throughput_ratio", timings["checkpoint_1s"], timings["no_checkpoints"], args.metric, ">= 0.9")
    out["no_checkpoint_rec_s"] = round(statistics.median(work / t.wall for t in timings["no_checkpoints"]))
    out["checkpoint_1s_rec_s"] = round(statistics.median(work / t.wall for t in timings["checkpoint_1s"]))
    with_runs(out, "timings_wall_cpu", timings)
    blocked = {}
    for k in (int(x) for x in args.keys.split(",")):
        blocked[str(k)] = b = blocked_per_checkpoint(k)
        print(f"  {k:>9,} keys: task blocked {b['blocked_ms_median']:.2f} ms (max {b['blocked_ms_max']:.2f}) per "
              f"checkpoint; async part {b['async_ms_median']:.1f} ms; state {b['state_mb']:.1f} MiB",
              flush=True)  # fmt: skip
    out["blocked_per_checkpoint"] = blocked
    out["loadavg_after"] = load_average()
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
