"""Checkpoint overhead on the in-process runtime.

1. Throughput of the same keyed job with checkpoints every 1 s vs none, alternating runs in this process,
   reported as a ratio (the machine is shared: only same-run ratios mean something).
2. How long a task is blocked per checkpoint (the synchronous part: pre-barrier flush + copy-on-write
   freeze + barrier forwarding) with 10k / 100k / 1M keys of keyed state, next to the asynchronous part
   (serialization and upload, which does not block processing).

Usage: python benchmarks/checkpoint_overhead.py [--rows N] [--repeats R] [--keys 10000,100000,1000000]
Last line: RESULT {json}
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from _common import CountSink  # type: ignore[import-not-found]
from sluice import CheckpointConfig, KeyedProcessFunction, Pipeline, ValueStateDescriptor
from sluice.connectors.generator import GeneratorSource


class Sum(KeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        self.d = ValueStateDescriptor("sum", 0)

    def process(self, key: Any, rows: pa.RecordBatch, ctx: Any) -> None:
        st = ctx.state(self.d)
        st.update(st.value() + pc.sum(rows.column("value")).as_py())


def vectorized_job(rows: int, interval: float | None, d: str) -> Pipeline:
    p = Pipeline(
        "overhead", parallelism=2, checkpoint=CheckpointConfig(interval=interval, storage=f"{d}/chk")
    )
    src = GeneratorSource(num_splits=4, records_per_split=rows // 4, batch_size=5000, num_keys=64)
    s = p.source(src).map_batches(lambda b: b.append_column("v2", pc.multiply(b.column("value"), 2)))
    s.filter(pc.field("v2") >= 0).key_by("key").process(Sum()).sink(CountSink())
    return p


def throughput(rows: int, interval: float | None) -> float:
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        vectorized_job(rows, interval, d).run(runtime="local", restore="none")
        return rows / (time.perf_counter() - t0)


def blocked_per_checkpoint(keys: int) -> dict[str, float]:
    """A fast source fills ``keys`` keys of state, a slow one keeps the job running for ~6 s of checkpoints."""
    with tempfile.TemporaryDirectory() as d:
        p = Pipeline("state", checkpoint=CheckpointConfig(interval=0.5, storage=f"{d}/chk"))
        fill = GeneratorSource(num_splits=1, records_per_split=keys, batch_size=20_000, num_keys=keys, name="fill")
        tick = GeneratorSource(num_splits=1, records_per_split=600, batch_size=10, num_keys=10,
                               rows_per_second=100, name="tick")
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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--keys", default="10000,100000,1000000")
    args = ap.parse_args()
    throughput(args.rows // 10, None)  # warm-up
    with_cp, without = [], []
    for _ in range(args.repeats):
        without.append(throughput(args.rows, None))
        with_cp.append(throughput(args.rows, 1.0))
        print(
            f"  no checkpoints {without[-1]:,.0f} rec/s | checkpoint every 1 s {with_cp[-1]:,.0f} rec/s",
            flush=True,
        )
    ratio = statistics.median(with_cp) / statistics.median(without)
    print(f"throughput with checkpoints every 1 s / without: {ratio:.3f}")
    blocked = {}
    for k in (int(x) for x in args.keys.split(",")):
        blocked[str(k)] = blocked_per_checkpoint(k)
        b = blocked[str(k)]
        print(
            f"  {k:>9,} keys: task blocked {b['blocked_ms_median']:.2f} ms (max {b['blocked_ms_max']:.2f}) per "
            f"checkpoint; async part {b['async_ms_median']:.1f} ms; state {b['state_mb']:.1f} MiB",
            flush=True,
        )
    result = {
        "rows": args.rows,
        "no_checkpoint_rec_s": round(statistics.median(without)),
        "checkpoint_1s_rec_s": round(statistics.median(with_cp)),
        "throughput_ratio": round(ratio, 3),
        "blocked_per_checkpoint": blocked,
    }
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
