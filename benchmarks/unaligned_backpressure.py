"""Checkpoint duration under sustained backpressure: aligned vs unaligned vs timeout-adaptive.

A fast generator feeds, through a hash exchange, an operator that runs at about 20% of the input rate,
so every buffer between them stays full. For backlogs of 1x, 4x and 16x the buffer capacity
(``buffers_per_channel``) it measures the median checkpoint duration of each mode, next to the same job
without backpressure (the reference). A checkpoint that times out counts as the timeout.

Usage: python benchmarks/unaligned_backpressure.py [--seconds S] [--base-buffers B] [--plot docs/x.png]
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
from _common import CountSink  # type: ignore[import-not-found]
from sluice import CheckpointConfig, Pipeline
from sluice.connectors.generator import GeneratorSource

BATCH = 500
TIMEOUT = 30.0


def slow_op(delay: float) -> Any:
    def op(batch: pa.RecordBatch) -> pa.RecordBatch:
        time.sleep(delay * batch.num_rows / BATCH)
        return batch

    return op


MAX_BATCH_ROWS = 0


def run(mode: str, buffers: int, seconds: float, delay: float, source_rate: float | None) -> dict[str, Any]:
    modes: dict[str, dict[str, Any]] = {
        "aligned": {},
        "unaligned": {"unaligned": True},
        "adaptive": {"aligned_checkpoint_timeout": 1.0},
    }
    with tempfile.TemporaryDirectory() as d:
        p = Pipeline(
            f"bp-{mode}-{buffers}",
            parallelism=2,
            buffers_per_channel=buffers,
            max_batch_rows=MAX_BATCH_ROWS,
            checkpoint=CheckpointConfig(
                interval=1.0,
                timeout=TIMEOUT,
                tolerable_failed_checkpoints=1000,
                storage=f"{d}/chk",
                **modes[mode],
            ),
        )
        src = GeneratorSource(
            num_splits=2, records_per_split=None, batch_size=BATCH, num_keys=1000, rows_per_second=source_rate
        )
        # a rebalance exchange (unaligned-capable) into the slow operator; the sink is chained to it
        p.source(src).rebalance().map_batches(slow_op(delay), name="slow").sink(CountSink())
        client = p.start(runtime="local", restore="none")
        time.sleep(seconds)
        result = client.cancel()
    done = [
        c
        for c in result.checkpoints
        if c.status == "completed" or (c.status == "failed" and c.failure_reason == "EXPIRED")
    ]
    durations = [TIMEOUT if c.status == "failed" else c.duration_s for c in done]
    return {
        "median_s": statistics.median(durations) if durations else TIMEOUT,
        "checkpoints": len(durations),
        "timed_out": sum(1 for c in done if c.status == "failed"),
        "inflight_bytes": statistics.median(
            [c.inflight_bytes for c in done if c.status == "completed"] or [0]
        ),
        "switched": sum(1 for c in done if c.switched_to_unaligned),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="run time per configuration")
    ap.add_argument("--base-buffers", type=int, default=2, help="buffers per channel at backlog factor 1")
    ap.add_argument("--delay", type=float, default=0.02, help="seconds the slow operator spends per batch")
    ap.add_argument("--plot", default="docs/unaligned-checkpoints.png")
    ap.add_argument("--max-batch-rows", type=int, default=0,
                    help="split batches so a barrier waits for at most this many rows (Pipeline.max_batch_rows)")
    args = ap.parse_args()
    global MAX_BATCH_ROWS
    MAX_BATCH_ROWS = args.max_batch_rows
    capacity = 2 * BATCH / args.delay  # rows/s of the two slow subtasks
    fast = 5 * capacity  # input at 5x the operator: it runs at ~20% of the input rate
    # the reference is the same job (same slow operator) fed below its capacity: no backpressure
    ref = run("aligned", args.base_buffers, args.seconds, args.delay, capacity / 4)
    print(
        f"reference (no backpressure): median {ref['median_s']:.3f}s over {ref['checkpoints']} checkpoints",
        flush=True,
    )
    adaptive_quiet = run("adaptive", args.base_buffers, args.seconds, args.delay, capacity / 4)
    print(
        f"adaptive without backpressure: {adaptive_quiet['inflight_bytes']} in-flight bytes persisted",
        flush=True,
    )
    out: dict[str, dict[str, Any]] = {m: {} for m in ("aligned", "unaligned", "adaptive")}
    for factor in (1, 4, 16):
        for mode in out:
            r = run(mode, args.base_buffers * factor, args.seconds, args.delay, fast)
            out[mode][str(factor)] = r
            print(
                f"x{factor:<2} {mode:<9} median {r['median_s']:7.3f}s  checkpoints {r['checkpoints']:>3} "
                f"timed out {r['timed_out']:>2}  switched {r['switched']:>2}  in-flight {r['inflight_bytes']:>10,.0f} B",
                flush=True,
            )
    result = {
        "reference_s": round(ref["median_s"], 4),
        **{f"{m}_s": {f: round(v["median_s"], 4) for f, v in out[m].items()} for m in out},
        "adaptive_inflight_bytes_no_backpressure": adaptive_quiet["inflight_bytes"],
        "details": out,
        "timeout_s": TIMEOUT,
    }
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        xs = [1, 4, 16]
        for m in out:
            ax.plot(xs, [out[m][str(x)]["median_s"] for x in xs], marker="o", label=m)
        ax.axhline(ref["median_s"], color="grey", linestyle="--", label="no backpressure")
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [f"x{x}" for x in xs])
        ax.set_xlabel("backlog (buffer capacity per channel)")
        ax.set_ylabel("median checkpoint duration (s)")
        ax.set_title("Checkpoint duration under backpressure (in-process runtime)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"plot written to {args.plot}")
    except ImportError:
        print("matplotlib not installed: no plot")
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
