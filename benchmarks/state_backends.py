"""State backends, measured at the keyed-backend level (issue 24; the Kafka job comes with the runtime
integration).

A keyed count: batches of int64 keys from a growing key space, each batch read (multi-get), incremented
and written back (write batch); between checkpoints ~1% of the keys change. Measured in one run:

* ``incremental_upload_fraction``: RocksDB incremental, bytes one checkpoint uploads / the checkpoint's
  full size, median over checkpoints at 1% change (full checkpoints: 1.0 by construction);
* ``checkpoint_growth``: checkpoint duration (synchronous + asynchronous part) at 10x the keys / at 1x, for
  RocksDB incremental (``checkpoint_growth``) and the hashmap backend (``hashmap_checkpoint_growth``);
* ``rocksdb_vs_hashmap``: throughput of the same batch-wise counting on RocksDB / on hashmap;
* ``state_mb`` / ``rss_mb``: a child process writes RocksDB state (random 200-byte values) with a 64 MiB
  memory budget; its peak resident memory against the state's size on disk.

Not measured here (they need the runtime integration, changelog or local recovery): changelog_upload_fraction,
local_vs_remote_restore, vs_quix; they are null in RESULT with the reason under ``not_measured``.

    python benchmarks/state_backends.py [--quick]

The last line is ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
import pyarrow as pa
from sluice.state.api import ValueStateDescriptor
from sluice.state.config import StateBackendConfig
from sluice.state.keygroups import key_group_range
from sluice.state.spi import KeyedStateBackend
from sluice.state.transfer import LocalFileTransfer

COUNT = ValueStateDescriptor("count", serializer="int64")
PAYLOAD = ValueStateDescriptor("payload", serializer="binary")
MAX_PARALLELISM = 128


def backend(kind: str, root: str, incremental: bool = True, memory: str = "256 mb") -> KeyedStateBackend:
    config = StateBackendConfig(type=kind, incremental=incremental, local_dir=os.path.join(root, "local"), memory=memory)  # type: ignore[arg-type]
    transfer = LocalFileTransfer(os.path.join(root, "storage"))
    be: KeyedStateBackend = config.create().create_keyed_backend("bench", key_group_range(MAX_PARALLELISM, 1, 0), MAX_PARALLELISM, transfer)
    return be


def count(be: KeyedStateBackend, keys: np.ndarray, batch: int = 10_000) -> None:
    """The keyed count, batch-wise: read, add one, write."""
    state = be.batch_state(COUNT)
    for at in range(0, len(keys), batch):
        kb = be.key_batch([pa.array(keys[at : at + batch])])
        old = state.get(kb).fill_null(0)
        state.put(kb, pa.compute.add(old, 1))


def checkpoint(be: KeyedStateBackend, cid: int) -> tuple[float, dict[str, Any]]:
    start = time.perf_counter()
    handle = be.snapshot(cid).run()
    elapsed = time.perf_counter() - start
    be.notify_checkpoint_complete(cid)
    return elapsed, handle


def sizes(handle: dict[str, Any]) -> tuple[int, int]:
    """(uploaded, full) bytes of a checkpoint."""
    if handle["format"] == "canonical":
        full = sum(len(v) for v in handle["groups"].values())
        return full, full
    shared = handle["shared"].values()
    private = sum(r["size"] for r in handle["private"].values())
    return sum(r["size"] for r in shared if not r["placeholder"]) + private, sum(r["size"] for r in shared) + private


def incremental_run(kind: str, keys: int, rounds: int, rng: np.random.Generator) -> dict[str, Any]:
    """Load ``keys`` keys, then ``rounds`` checkpoints after 1% of the keys changed each."""
    with tempfile.TemporaryDirectory() as root:
        be = backend(kind, root)
        count(be, np.arange(keys, dtype=np.int64))
        checkpoint(be, 1)
        fractions, durations = [], []
        for r in range(rounds):
            count(be, rng.choice(keys, size=keys // 100, replace=False).astype(np.int64))
            elapsed, handle = checkpoint(be, 2 + r)
            up, full = sizes(handle)
            fractions.append(up / full)
            durations.append(elapsed)
        be.dispose()
    return {"fraction": statistics.median(fractions), "duration": statistics.median(durations)}


def throughput(kind: str, keys: int, records: int, rng: np.random.Generator) -> float:
    stream = rng.integers(0, keys, size=records, dtype=np.int64)
    with tempfile.TemporaryDirectory() as root:
        be = backend(kind, root)
        count(be, np.arange(keys, dtype=np.int64))
        start = time.perf_counter()
        count(be, stream)
        rate = records / (time.perf_counter() - start)
        be.dispose()
    return rate


def peak_rss_mb() -> float:
    """This process's peak resident memory (VmHWM: unlike ru_maxrss, not inherited from the parent that
    forked it)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def large_state(target_mb: int, memory: str) -> dict[str, Any]:
    """(Child process.) Write ``target_mb`` of RocksDB state under a memory budget; peak RSS and state size."""
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory(dir=os.environ.get("SLUICE_BENCH_DIR")) as root:
        be = backend("rocksdb", root, memory=memory)
        state = be.batch_state(PAYLOAD)
        value_size, batch, written = 200, 20_000, 0
        key = 0
        start = time.perf_counter()
        while written < target_mb << 20:
            values = pa.array([bytes(rng.bytes(value_size)) for _ in range(batch)], pa.binary())
            state.put(be.key_batch([pa.array(np.arange(key, key + batch, dtype=np.int64))]), values)
            key += batch
            written += batch * (value_size + 20)
        be.db.flush()  # type: ignore[attr-defined]
        probe = be.key_batch([pa.array(rng.integers(0, key, size=10_000, dtype=np.int64))])
        found = state.get(probe).null_count == 0
        on_disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)
        seconds = time.perf_counter() - start
        be.dispose()
    rss_mb = peak_rss_mb()
    return {"state_mb": on_disk / (1 << 20), "rss_mb": rss_mb, "keys": key, "seconds": seconds, "all_found": found}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller sizes (a few minutes)")
    parser.add_argument("--large-state", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--memory", default="64 mb", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.large_state:
        print(json.dumps(large_state(args.large_state, args.memory)))
        return
    rng = np.random.default_rng(7)
    small = 100_000 if args.quick else 300_000
    rounds = 5 if args.quick else 9
    result: dict[str, Any] = {"quick": args.quick}

    inc_1x = incremental_run("rocksdb", small, rounds, rng)
    inc_10x = incremental_run("rocksdb", small * 10, rounds, rng)
    heap_1x = incremental_run("hashmap", small, rounds, rng)
    heap_10x = incremental_run("hashmap", small * 10, rounds, rng)
    print(f"rocksdb incremental: upload fraction {inc_1x['fraction']:.3f} at {small} keys, {inc_10x['fraction']:.3f} at {small * 10}")
    print(f"checkpoint duration rocksdb {inc_1x['duration'] * 1000:.0f} -> {inc_10x['duration'] * 1000:.0f} ms, "
          f"hashmap {heap_1x['duration'] * 1000:.0f} -> {heap_10x['duration'] * 1000:.0f} ms")  # fmt: skip
    result["incremental_upload_fraction"] = round(inc_10x["fraction"], 4)
    result["incremental_upload_fraction_small"] = round(inc_1x["fraction"], 4)
    result["checkpoint_growth"] = round(inc_10x["duration"] / inc_1x["duration"], 2)
    result["hashmap_checkpoint_growth"] = round(heap_10x["duration"] / heap_1x["duration"], 2)
    result["checkpoint_ms"] = {"rocksdb_1x": round(inc_1x["duration"] * 1000, 1), "rocksdb_10x": round(inc_10x["duration"] * 1000, 1),
                               "hashmap_1x": round(heap_1x["duration"] * 1000, 1), "hashmap_10x": round(heap_10x["duration"] * 1000, 1)}  # fmt: skip

    records = 500_000 if args.quick else 2_000_000
    rates = {kind: [] for kind in ("hashmap", "rocksdb")}  # type: dict[str, list[float]]
    for _ in range(2):  # alternated: the machine is shared
        for kind in rates:
            rates[kind].append(throughput(kind, small, records, rng))
    best = {k: max(v) for k, v in rates.items()}
    print(f"batch-wise keyed count: hashmap {best['hashmap'] / 1e3:.0f} k rec/s, rocksdb {best['rocksdb'] / 1e3:.0f} k rec/s")
    result["throughput_rec_s"] = {k: round(v) for k, v in best.items()}
    result["rocksdb_vs_hashmap"] = round(best["rocksdb"] / best["hashmap"], 3)

    target = 1024 if args.quick else 4096
    child = subprocess.run(
        [sys.executable, __file__, "--large-state", str(target), "--memory", args.memory],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    large = json.loads(child.stdout.strip().splitlines()[-1])
    print(f"large state: {large['state_mb']:.0f} MiB on disk ({large['keys']} keys) with peak RSS {large['rss_mb']:.0f} MiB "
          f"(memory budget {args.memory}), {large['seconds']:.0f} s, every probed key found: {large['all_found']}")  # fmt: skip
    result["state_mb"] = round(large["state_mb"])
    result["rss_mb"] = round(large["rss_mb"])
    result["state_to_rss"] = round(large["state_mb"] / large["rss_mb"], 2)
    result["memory_budget"] = args.memory
    result["changelog_upload_fraction"] = None
    result["local_vs_remote_restore"] = None
    result["vs_quix"] = None
    result["not_measured"] = {
        "changelog_upload_fraction": "changelog checkpoints are not implemented yet",
        "local_vs_remote_restore": "local recovery is not implemented yet",
        "vs_quix": "needs the keyed Kafka job on the runtime (phase 2)",
    }
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
