"""Checkpoint duration under sustained backpressure: aligned vs unaligned vs timeout-adaptive.

A fast generator feeds, through a rebalance exchange, an operator that runs at about 20% of the input rate,
so every buffer between them stays full. For backlogs of 1x, 4x and 16x the buffer capacity
(``buffers_per_channel``) it measures the median checkpoint duration of each mode, next to the same job
fed below the operator's capacity (the reference: no backpressure). A checkpoint that times out counts as
the timeout.

The metric is named before the run: the median checkpoint duration of a run (seconds, lower is better).
Every configuration (the reference, adaptive without backpressure, and each mode at each backlog) is a
side; the sides run in alternated rounds (``--rounds``, at least 3, the order rotated) after an untimed,
shorter warm-up of each (benchmarks/_common.py). Each figure is the median of its rounds, printed with every
round and the spread, and ``<mode>_vs_reference_x<factor>`` the median of the per-round ratios to the
reference (target, issue: unaligned within 2x of the reference). Each run reads a bounded input sized to
last about ``--seconds`` at the operator's speed, and its output (the ids a light two-phase-commit sink
committed, benchmarks/_checks.py) is checked against the generator's rows: every row exactly once. Wall
and process-tree CPU time of each run are printed beside.

Usage: python benchmarks/unaligned_backpressure.py [--quick] [--seconds S] [--rounds 3] [--base-buffers B]
       [--plot docs/x.png]
Last line: RESULT {json}
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _checks import IdSink, check_generator_output, read_ids  # type: ignore[import-not-found]
from _common import Stopwatch, alternate, load_average, report  # type: ignore[import-not-found]
from sluice import CheckpointConfig, Pipeline
from sluice.connectors.generator import GeneratorSource

BATCH = 500
TIMEOUT = 30.0
KEYS = 1000
MODES = ("aligned", "unaligned", "adaptive")
FACTORS = (1, 4, 16)


def slow_op(delay: float) -> Any:
    def op(batch: pa.RecordBatch) -> pa.RecordBatch:
        time.sleep(delay * batch.num_rows / BATCH)
        return batch

    return op


def run(mode: str, buffers: int, seconds: float, delay: float, source_rate: float | None, max_batch_rows: int) -> dict[str, Any]:
    """One run of an unbounded input for ``seconds``, then stopped with a last checkpoint (its sink commits it,
    so the output is each split's first rows)."""
    modes: dict[str, dict[str, Any]] = {
        "aligned": {},
        "unaligned": {"unaligned": True},
        "adaptive": {"aligned_checkpoint_timeout": 1.0},
    }
    with tempfile.TemporaryDirectory() as d:
        p = Pipeline(f"bp-{mode}-{buffers}", parallelism=2, buffers_per_channel=buffers, max_batch_rows=max_batch_rows,
                     checkpoint=CheckpointConfig(interval=1.0, timeout=TIMEOUT, tolerable_failed_checkpoints=1000,
                                                 storage=f"{d}/chk", **modes[mode]))  # fmt: skip
        src = GeneratorSource(num_splits=2, records_per_split=None, batch_size=BATCH, num_keys=KEYS,
                              rows_per_second=source_rate)  # fmt: skip
        # a rebalance exchange (unaligned-capable) into the slow operator; the sink is chained to it
        p.source(src).rebalance().map_batches(slow_op(delay), name="slow").sink(IdSink(f"{d}/out"))
        with Stopwatch() as sw:
            client = p.start(runtime="local", restore="none")
            time.sleep(seconds)
            stopped = time.time()  # checkpoints triggered after this (the stop's own) are not counted
            result = client.stop(savepoint=False)
        checked = check_generator_output(read_ids(f"{d}/out"), 2, KEYS, label=f"{mode} x{buffers}")
    done = [c for c in result.checkpoints if c.trigger_time < stopped and (
            c.status == "completed" or (c.status == "failed" and c.failure_reason == "EXPIRED"))]  # fmt: skip
    durations = [TIMEOUT if c.status == "failed" else c.duration_s for c in done]
    return {
        "median_s": statistics.median(durations) if durations else TIMEOUT,
        "checkpoints": len(durations),
        "timed_out": sum(1 for c in done if c.status == "failed"),
        "inflight_bytes": statistics.median([c.inflight_bytes for c in done if c.status == "completed"] or [0]),
        "switched": sum(1 for c in done if c.switched_to_unaligned),
        "wall_s": round(sw.timing.wall, 2),
        "cpu_s": round(sw.timing.cpu, 2),
        "rows_checked": checked["rows"],
    }


def show(r: dict[str, Any]) -> str:
    return (f"median {r['median_s']:7.3f}s  checkpoints {r['checkpoints']:>3}  timed out {r['timed_out']:>2}  "
            f"switched {r['switched']:>2}  in-flight {r['inflight_bytes']:>10,.0f} B  ({r['wall_s']} s wall, "
            f"{r['cpu_s']} CPU-s, {r['rows_checked']:,} rows checked)")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="6 s per run")
    ap.add_argument("--seconds", type=float, default=15.0, help="run time per configuration")
    ap.add_argument("--base-buffers", type=int, default=2, help="buffers per channel at backlog factor 1")
    ap.add_argument("--delay", type=float, default=0.02, help="seconds the slow operator spends per batch")
    ap.add_argument("--plot", default=None, help="where to draw the plot (default docs/unaligned-checkpoints.png, "
                    "none with --quick; '' for none)")
    ap.add_argument("--max-batch-rows", type=int, default=0,
                    help="split batches so a barrier waits for at most this many rows (Pipeline.max_batch_rows)")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=3, help="alternated rounds, at least 3 (default 3)")
    ap.add_argument("--no-warmup", action="store_true", help="no untimed run of each side before the rounds")
    args = ap.parse_args()
    if args.quick:
        args.seconds = 6.0
    if args.plot is None:
        args.plot = "" if args.quick else "docs/unaligned-checkpoints.png"
    if args.rounds < 3:
        raise SystemExit(f"--rounds must be at least 3 (got {args.rounds}): a median of fewer says little")
    print(f"metric: a run's median checkpoint duration (named before the run; wall and CPU time beside), "
          f"{args.rounds} alternated rounds, warm-up {'off' if args.no_warmup else 'on'}, load average "
          f"{load_average()}", flush=True)  # fmt: skip
    capacity = 2 * BATCH / args.delay  # rows/s of the two slow subtasks
    fast = 5 * capacity  # input at 5x the operator: it runs at ~20% of the input rate
    sides = {"reference": ("aligned", 1, capacity / 4), "adaptive_quiet": ("adaptive", 1, capacity / 4),
             **{f"{m}_x{f}": (m, f, fast) for f in FACTORS for m in MODES}}  # fmt: skip

    def one(side: str, r: int) -> dict[str, Any]:
        mode, factor, rate = sides[side]
        secs = args.seconds if r else min(args.seconds, 3.0)
        return run(mode, args.base_buffers * factor, secs, args.delay, rate, args.max_batch_rows)

    out: dict[str, Any] = {"seconds": args.seconds, "rounds": args.rounds, "max_batch_rows": args.max_batch_rows,
                           "loadavg_before": load_average()}  # fmt: skip
    runs = alternate(list(sides), args.rounds, one, warmup=not args.no_warmup, show=show)
    med: dict[str, float] = {}
    for side, rs in runs.items():
        report(out, f"{side}_s", [x["median_s"] for x in rs], digits=4)
        med[side] = out.pop(f"{side}_s")
    for f in FACTORS:
        for m in MODES:
            report(out, f"{m}_vs_reference_x{f}", [x["median_s"] / max(y["median_s"], 1e-4)
                                                   for x, y in zip(runs[f"{m}_x{f}"], runs["reference"], strict=True)],
                   "<= 2" if m == "unaligned" else None, digits=2)  # fmt: skip
    result = {
        "reference_s": med["reference"],
        **{f"{m}_s": {str(f): med[f"{m}_x{f}"] for f in FACTORS} for m in MODES},
        **{f"{m}_s_runs": {str(f): [round(x["median_s"], 4) for x in runs[f"{m}_x{f}"]] for f in FACTORS} for m in MODES},
        "reference_s_runs": [round(x["median_s"], 4) for x in runs["reference"]],
        "adaptive_inflight_bytes_no_backpressure": statistics.median(x["inflight_bytes"] for x in runs["adaptive_quiet"]),
        "adaptive_inflight_bytes_no_backpressure_runs": [x["inflight_bytes"] for x in runs["adaptive_quiet"]],
        "details": {m: {str(f): runs[f"{m}_x{f}"] for f in FACTORS} for m in MODES},
        "timeout_s": TIMEOUT,
        **{k: v for k, v in out.items() if "_vs_reference_" in k},
        "loadavg_before": out["loadavg_before"],
        "loadavg_after": load_average(),
    }
    if args.plot:
        plot(args.plot, med)
    print("RESULT " + json.dumps(result))


def plot(path: str, med: dict[str, float]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for m in MODES:
        ax.plot(FACTORS, [med[f"{m}_x{x}"] for x in FACTORS], marker="o", label=m)
    ax.axhline(med["reference"], color="grey", linestyle="--", label="no backpressure")
    ax.set_xscale("log", base=2)
    ax.set_xticks(FACTORS, [f"x{x}" for x in FACTORS])
    ax.set_xlabel("backlog (buffer capacity per channel)")
    ax.set_ylabel("median checkpoint duration (s, median of rounds)")
    ax.set_title("Checkpoint duration under backpressure (in-process runtime)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot written to {path}")


if __name__ == "__main__":
    main()
