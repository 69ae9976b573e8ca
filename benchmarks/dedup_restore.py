"""Deduplication right after a restore against the same job running on (issue 34, item 8).

The ``deduplicate(keep="first")`` operator is driven directly (no Kafka: the figure is the operator's) on the
RocksDB backend (incremental checkpoints, 256 MB), over ``--events`` int64 ids at 1 ms apart, ``--dups`` of
them repeats of an id seen up to 50 s before (they must be dropped), in batches of 10,000 with a watermark
1 s behind after each, and a checkpoint every ``--interval`` records (snapshot, upload, complete). Each
round runs the same input twice, alternating which goes first:

* ``steady``: one operator instance from start to end;
* ``restore``: after the first half, the operator is closed and a new one restored from the last checkpoint
  at the start of each of ``--restores`` segments of the second half (a job killed and restored there).

The metric, named in advance: **records per busy second** (busy: the wall time spent in the operator's
calls on its task thread: ``process_batch``, ``process_watermark``, the synchronous part of the snapshot;
not the restore itself, reported apart, nor the asynchronous upload) of the first checkpoint interval after
each restore, divided by that of the same interval in the steady run (``first_interval_ratio``, target
>= 0.5: within 2x from the first checkpoint on). Also: the same ratio over the whole second half, restore
times, the Bloom filters' bytes (what checkpointing them would add to every checkpoint) beside the bytes
each checkpoint persisted. Both runs' output is checked against a plain-Python reference over the input.

Usage: python benchmarks/dedup_restore.py [--rounds 3] [--events 2000000] [--restores 4]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

import numpy as np
import pyarrow as pa
from sluice.keys import KeySelector
from sluice.operators.base import OperatorContext
from sluice.operators.dedup import DeduplicateOperator
from sluice.state.config import StateBackendConfig
from sluice.state.factory import state_backend_for
from sluice.state.handles import persisted_bytes
from sluice.state.keygroups import KeyGroupRange
from sluice.state.transfer import LocalFileTransfer

T0 = 1_700_000_000_000
BATCH = 10_000
MAX_PARALLELISM = 128


def make_input(n: int, dups: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """ids and event times: new ids counting up, a ``dups`` share of repeats of an id up to 50,000 rows back."""
    rng = np.random.default_rng(seed)
    ids = np.zeros(n, np.int64)
    repeat = rng.random(n) < dups
    repeat[:1] = False
    back = rng.integers(1, 50_001, n)
    fresh = 0
    for i in range(n):
        if repeat[i]:
            ids[i] = ids[max(0, i - int(back[i]))]
        else:
            ids[i] = fresh
            fresh += 1
    return ids, T0 + np.arange(n, dtype=np.int64)


def reference(ids: np.ndarray, ts: np.ndarray, within: int) -> list[int]:
    """Row numbers keep="first" emits: a record passes unless its key's open horizon (opened by the key's
    last passing record at ``t``) still covers it (``ts < t + within``). Plain Python, record by record."""
    start: dict[int, int] = {}
    out = []
    for i, (k, t) in enumerate(zip(ids.tolist(), ts.tolist(), strict=True)):
        s = start.get(k)
        if s is None or t - s >= within:
            start[k] = t
            out.append(i)
    return out


class Collected:
    def __init__(self) -> None:
        self.rows: list[np.ndarray] = []

    def emit(self, batch: pa.RecordBatch) -> None:
        self.rows.append(batch.column("row").to_numpy())

    def emit_side(self, tag: str, batch: pa.RecordBatch) -> None:
        raise AssertionError(tag)

    def emit_watermark(self, timestamp: int) -> None:
        pass


class Run:
    """One operator instance at a time over the input, restarted from its last checkpoint on request."""

    def __init__(self, root: str, within: int) -> None:
        self.config = StateBackendConfig(
            type="rocksdb", incremental=True, memory="256 mb", local_dir=os.path.join(root, "local")
        )
        self.files = LocalFileTransfer(os.path.join(root, "chk"))
        self.within = within
        self.out = Collected()
        self.checkpoint_id = 0
        self.handle: dict[str, Any] | None = None
        self.persisted: list[int] = []
        self.op = self._start([])

    def _start(self, restore: list[dict[str, Any]]) -> DeduplicateOperator:
        op = DeduplicateOperator("dedup", KeySelector("id"), self.within, "ts")
        ctx = OperatorContext(
            name="dedup", subtask=0, parallelism=1, max_parallelism=MAX_PARALLELISM,
            key_groups=KeyGroupRange(0, MAX_PARALLELISM), job_id="bench", attempt=0,
            state_backend=state_backend_for(self.config), state_files=self.files,
        )  # fmt: skip
        op.setup(ctx, self.out)
        op.initialize_state(restore, [None] * len(restore))
        op.open()
        return op

    def restart(self) -> tuple[float, float]:
        """Close the operator and restore a new one from the last checkpoint; the restore's seconds (wall, and
        CPU of this thread)."""
        assert self.handle is not None
        self.op.close()
        t0, c0 = time.perf_counter(), time.thread_time()
        self.op = self._start([self.handle])
        return time.perf_counter() - t0, time.thread_time() - c0

    def batch(self, batch: pa.RecordBatch) -> np.ndarray:
        """Process one batch and its watermark; busy seconds (wall, and CPU of this thread)."""
        t0, c0 = time.perf_counter(), time.thread_time()
        self.op.process_batch(batch)
        self.op.process_watermark(int(batch.column("ts")[-1].as_py()) - 1000)
        return np.array([time.perf_counter() - t0, time.thread_time() - c0])

    def checkpoint(self) -> np.ndarray:
        """A checkpoint: busy seconds of its synchronous part (the upload runs beside the task in a job)."""
        self.checkpoint_id += 1
        t0, c0 = time.perf_counter(), time.thread_time()
        snap = self.op.snapshot_state(self.checkpoint_id)
        busy = np.array([time.perf_counter() - t0, time.thread_time() - c0])
        assert snap.keyed is not None
        self.handle = snap.keyed.run()
        self.persisted.append(persisted_bytes(self.handle))
        t0, c0 = time.perf_counter(), time.thread_time()
        self.op.notify_checkpoint_complete(self.checkpoint_id)
        return busy + np.array([time.perf_counter() - t0, time.thread_time() - c0])

    def filter_bytes(self) -> int:
        """Bytes of the Bloom filters held now."""
        store = self.op._horizons
        assert store is not None
        return sum(w.nbytes for f in store._blooms.values() if f is not None for w, _ in f._segments)


def run(kind: str, ids: np.ndarray, ts: np.ndarray, args: argparse.Namespace, expected: np.ndarray) -> dict[str, Any]:
    """One run; per checkpoint interval of the second half, its records per busy second."""
    root = tempfile.mkdtemp(prefix=f"dedup-restore-{kind}-")
    try:
        r = Run(root, args.within_ms)
        n, half = len(ids), len(ids) // 2
        segment = (n - half) // args.restores
        per_interval = args.interval // BATCH
        restores: list[tuple[float, float]] = []
        intervals: list[np.ndarray] = []  # records per busy second (wall, CPU) of each interval of the second half
        busy, records, filters = np.zeros(2), 0, 0
        for b, at in enumerate(range(0, n, BATCH)):
            if at >= half and (at - half) % segment == 0 and at - half < segment * args.restores:
                filters = max(filters, r.filter_bytes())
                if kind == "restore":
                    restores.append(r.restart())
            batch = pa.RecordBatch.from_arrays(
                [pa.array(ids[at : at + BATCH]), pa.array(ts[at : at + BATCH]), pa.array(np.arange(at, min(n, at + BATCH)))],
                names=["id", "ts", "row"],
            )
            busy += r.batch(batch)
            records += batch.num_rows
            if (b + 1) % per_interval == 0:
                busy += r.checkpoint()
                if at >= half:
                    intervals.append(records / busy)
                busy, records = np.zeros(2), 0
        r.op.close()
        got = np.sort(np.concatenate(r.out.rows))
        if not np.array_equal(got, expected):
            raise RuntimeError(f"{kind}: {len(got)} records passed, the reference passes {len(expected)} (or others)")
        return {
            "intervals": intervals, "restore_s": restores, "filter_bytes": filters,
            "persisted_bytes_median": int(statistics.median(r.persisted[len(r.persisted) // 2 :])),
        }  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)


def spread(values: list[float]) -> dict[str, Any]:
    return {"runs": [round(v, 3) for v in values], "median": round(statistics.median(values), 3),
            "min": round(min(values), 3), "max": round(max(values), 3)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--dups", type=float, default=0.1, help="share of records that repeat a recent id")
    ap.add_argument("--within-ms", type=int, default=600_000, help="the horizon (default 10 min: 4 buckets live)")
    ap.add_argument("--interval", type=int, default=50_000, help="records per checkpoint")
    ap.add_argument("--restores", type=int, default=4)
    args = ap.parse_args()
    segment = (args.events - args.events // 2) // args.restores
    if args.interval % BATCH or segment % args.interval or (args.events // 2) % args.interval:
        ap.error(f"--interval must be a multiple of {BATCH} and divide the segments of {segment} records")
    load0 = os.getloadavg()
    ids, ts = make_input(args.events, args.dups, seed=7)
    expected = np.array(reference(ids, ts, args.within_ms), np.int64)
    print(f"{args.events:,} records, {len(expected):,} pass the reference; load {load0[0]:.1f}", flush=True)
    per_segment = segment // args.interval
    firsts = [i * per_segment for i in range(args.restores)]  # the first interval after each restore
    # per metric (0: busy wall time, the named one; 1: CPU time of the task thread), per round
    first: list[list[float]] = [[], []]  # restore / steady of the first intervals (median over the restores)
    whole: list[list[float]] = [[], []]  # restore / steady over the whole second half
    steady: list[list[float]] = [[], []]
    after: list[list[float]] = [[], []]
    restore_s: list[float] = []
    restore_cpu_s: list[float] = []
    filter_bytes = persisted = 0
    for rnd in range(args.rounds):
        order = ("steady", "restore") if rnd % 2 == 0 else ("restore", "steady")
        res = {kind: run(kind, ids, ts, args, expected) for kind in order}
        s, r = np.array(res["steady"]["intervals"]), np.array(res["restore"]["intervals"])
        for m in (0, 1):
            first[m].append(float(np.median(r[firsts, m] / s[firsts, m])))
            whole[m].append(statistics.harmonic_mean(r[:, m]) / statistics.harmonic_mean(s[:, m]))
            steady[m].append(float(np.median(s[:, m])))
            after[m].append(float(np.median(r[firsts, m])))
        restore_s += [w for w, _ in res["restore"]["restore_s"]]
        restore_cpu_s += [c for _, c in res["restore"]["restore_s"]]
        filter_bytes = max(filter_bytes, res["steady"]["filter_bytes"])
        persisted = res["steady"]["persisted_bytes_median"]
        print(
            f"round {rnd + 1} ({' then '.join(order)}): first interval after each restore "
            f"{', '.join(f'{x:,.0f}' for x in r[firsts, 0])} rec/busy-s against "
            f"{', '.join(f'{x:,.0f}' for x in s[firsts, 0])} steady: ratio {first[0][-1]:.2f} (CPU {first[1][-1]:.2f}); "
            f"second half {whole[0][-1]:.2f} (CPU {whole[1][-1]:.2f}); restores "
            f"{', '.join(f'{w:.2f}' for w, _ in res['restore']['restore_s'])} s "
            f"(CPU {', '.join(f'{c:.2f}' for _, c in res['restore']['restore_s'])} s)",
            flush=True,
        )
    load1 = os.getloadavg()
    result = {
        "events": args.events, "dups": args.dups, "within_ms": args.within_ms, "interval": args.interval,
        "restores": args.restores, "rounds": args.rounds, "load_before": round(load0[0], 1), "load_after": round(load1[0], 1),
        "first_interval_ratio": spread(first[0])["median"], "first_interval_ratio_runs": spread(first[0]),
        "first_interval_ratio_cpu_runs": spread(first[1]),
        "second_half_ratio": spread(whole[0])["median"], "second_half_ratio_runs": spread(whole[0]),
        "second_half_ratio_cpu_runs": spread(whole[1]),
        "steady_rec_per_busy_s": spread(steady[0]), "first_interval_rec_per_busy_s": spread(after[0]),
        "steady_rec_per_cpu_s": spread(steady[1]), "first_interval_rec_per_cpu_s": spread(after[1]),
        "restore_s": spread(restore_s), "restore_cpu_s": spread(restore_cpu_s), "filter_bytes": filter_bytes, "checkpoint_persisted_bytes_median": persisted,
    }  # fmt: skip
    print(f"first_interval_ratio {result['first_interval_ratio']:.2f} (target >= 0.5)", flush=True)
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
