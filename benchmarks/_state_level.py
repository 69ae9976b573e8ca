"""State backends, measured at the keyed-backend level (issue 24; the Kafka job comes with the runtime
integration).

A keyed count: batches of int64 keys from a growing key space, each batch read (multi-get), incremented
and written back (write batch); between checkpoints ~1% of the keys change. Measured in one run:

* ``incremental_upload_fraction``: RocksDB incremental, bytes one checkpoint uploads / the checkpoint's
  full size, median over checkpoints at 1% change (full checkpoints: 1.0 by construction);
* ``checkpoint_growth``: checkpoint duration (synchronous + asynchronous part) at 10x the keys / at 1x, for
  RocksDB incremental (``checkpoint_growth``) and the hashmap backend (``hashmap_checkpoint_growth``);
* ``rocksdb_vs_hashmap``: throughput of the same batch-wise counting on RocksDB / on hashmap, 100k keys, 500k
  records (2M in the full run), the timed part ending with a checkpoint's synchronous part (RocksDB: the
  write-back cache's dirty entries written, memtables flushed, native checkpoint); the best of two runs
  each, alternated. Also with the write-back cache off (``rocksdb_vs_hashmap_no_cache``) and with a cache
  that holds about a quarter of the keys (``rocksdb_vs_hashmap_small_cache``: 16 MiB budget), and the same
  ratios on process CPU time (``*_cpu``: less at the mercy of other work on a shared machine);
* ``state_mb`` / ``rss_mb``: a child process writes RocksDB state (random 200-byte values) with a 64 MiB
  memory budget; its peak resident memory against the state's size on disk;
* ``changelog_upload_fraction``: RocksDB with changelog checkpoints, bytes one checkpoint uploads / the
  full state (the materialization's files), median over checkpoints at 1% change, a background
  materialization before every 5th checkpoint (``changelog_upload_fraction_mean`` averages them in; the
  hashmap backend's figures under ``hashmap_changelog_upload_fraction``);
* ``local_vs_remote_restore``: restore time of a RocksDB subtask (incremental) from its local copy (local
  recovery) / from checkpoint storage on S3 (a moto server in this process, through a small boto3 transfer
  written for the benchmark: the job's S3 checkpoint storage is adapted to the state layer with the
  runtime integration); ``local_vs_folder_restore`` the same against checkpoint storage in a local folder
  (``_changelog``: with changelog checkpoints).

Not measured here (it needs the keyed Kafka job on the runtime): vs_quix; null in RESULT with the reason
under ``not_measured``.

    python benchmarks/state_backends.py [--quick]

The last line is ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import logging
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
from sluice.state.handles import persisted_bytes, total_bytes
from sluice.state.keygroups import key_group_range
from sluice.state.spi import KeyedStateBackend
from sluice.state.transfer import LocalFileTransfer

COUNT = ValueStateDescriptor("count", serializer="int64")
PAYLOAD = ValueStateDescriptor("payload", serializer="binary")
MAX_PARALLELISM = 128


class S3Transfer:
    """A FileTransfer on an S3 bucket (for this benchmark only)."""

    def __init__(self, client: Any, bucket: str) -> None:
        self.client, self.bucket, self.location = client, bucket, f"s3://{bucket}"

    def upload(self, local_path: str, remote_path: str) -> None:
        self.client.upload_file(local_path, self.bucket, remote_path)

    def download(self, remote_path: str, local_path: str) -> None:
        self.client.download_file(self.bucket, remote_path, local_path)

    def delete(self, remote_path: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=remote_path)

    def exists(self, remote_path: str) -> bool:
        return bool(self.client.list_objects_v2(Bucket=self.bucket, Prefix=remote_path).get("KeyCount"))

    def list(self, prefix: str) -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def s3_transfer() -> tuple[S3Transfer, Any]:
    """A bucket on a moto S3 server started here; the transfer and the server (to stop)."""
    import socket

    from moto.server import ThreadedMotoServer
    from sluice.io.s3 import make_client

    logging.getLogger("werkzeug").setLevel(logging.ERROR)

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    for key, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"), ("AWS_DEFAULT_REGION", "us-east-1")):
        os.environ.setdefault(key, value)
    client = make_client({"endpoint_url": f"http://127.0.0.1:{port}"})
    client.create_bucket(Bucket="checkpoints")
    return S3Transfer(client, "checkpoints"), server


def backend(
    kind: str, root: str, incremental: bool = True, memory: str = "256 mb", transfer: Any = None, **options: Any
) -> KeyedStateBackend:
    config = StateBackendConfig(type=kind, incremental=incremental, local_dir=os.path.join(root, "local"), memory=memory, **options)  # type: ignore[arg-type]
    transfer = transfer or LocalFileTransfer(os.path.join(root, "storage"))
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


def changelog_run(kind: str, keys: int, rounds: int, rng: np.random.Generator) -> dict[str, Any]:
    """Load ``keys`` keys, then ``rounds`` changelog checkpoints after 1% of the keys changed each, a
    materialization (waited for) before every 5th."""
    with tempfile.TemporaryDirectory() as root:
        be = backend(kind, root, changelog=True, changelog_materialize_interval="1 h")
        count(be, np.arange(keys, dtype=np.int64))
        be.materialize().result()  # type: ignore[union-attr]
        _, handle = checkpoint(be, 1)
        fractions, durations = [], []
        for r in range(rounds):
            count(be, rng.choice(keys, size=keys // 100, replace=False).astype(np.int64))
            if r % 5 == 4:
                be.materialize().result()  # type: ignore[union-attr]
            elapsed, handle = checkpoint(be, 2 + r)
            full = total_bytes(handle["base"]["handle"])
            fractions.append(persisted_bytes(handle) / full)
            durations.append(elapsed)
        be.dispose()
    return {"fraction": statistics.median(fractions), "mean": statistics.fmean(fractions), "duration": statistics.median(durations)}


def restore_times(keys: int, rounds: int, changelog: bool, transfer: Any = None) -> dict[str, float]:
    """Restore a RocksDB subtask of ``keys`` keys from its local copy and from checkpoint storage, alternated
    ``rounds`` times; the fastest of each."""
    with tempfile.TemporaryDirectory() as root:
        options: dict[str, Any] = {"local_recovery": True, "changelog": changelog, "transfer": transfer}
        be = backend("rocksdb", root, **options)
        count(be, np.arange(keys, dtype=np.int64))
        if changelog:
            be.materialize().result()  # type: ignore[union-attr]
        count(be, np.arange(0, keys, 100, dtype=np.int64))
        _, handle = checkpoint(be, 1)
        be.dispose()
        times: dict[str, list[float]] = {"local": [], "remote": []}
        for _ in range(rounds):
            for where in times:
                restored = backend("rocksdb", root, **{**options, "local_recovery": where == "local"})
                start = time.perf_counter()
                restored.restore([handle])
                times[where].append(time.perf_counter() - start)
                if where == "local":
                    assert restored.store.used > 0 and restored.store.refused == 0  # type: ignore[attr-defined]
                restored.dispose()
        state_mb = total_bytes(handle) / (1 << 20)
    return {"local": min(times["local"]), "remote": min(times["remote"]), "state_mb": state_mb}


def throughput(kind: str, keys: int, records: int, rng: np.random.Generator, **options: Any) -> tuple[float, float]:
    """Records per second of the keyed count over ``keys`` loaded keys, including a checkpoint's synchronous
    part at the end: on the wall clock and on this process's CPU time."""
    stream = rng.integers(0, keys, size=records, dtype=np.int64)
    with tempfile.TemporaryDirectory() as root:
        be = backend(kind, root, **options)
        count(be, np.arange(keys, dtype=np.int64))
        be.snapshot(1).discard()
        start, cpu = time.perf_counter(), time.process_time()
        count(be, stream)
        snap = be.snapshot(2)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        snap.discard()
        be.dispose()
    return records / wall, records / cpu


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
        be.flush()  # type: ignore[attr-defined]
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

    log_rocks = changelog_run("rocksdb", small * 10, rounds * 2, rng)
    log_heap = changelog_run("hashmap", small, rounds * 2, rng)
    print(f"changelog: upload fraction rocksdb {log_rocks['fraction']:.4f} (mean with materializations {log_rocks['mean']:.4f}) "
          f"at {small * 10} keys, hashmap {log_heap['fraction']:.4f} ({log_heap['mean']:.4f}) at {small}; checkpoint "
          f"{log_rocks['duration'] * 1000:.0f} ms / {log_heap['duration'] * 1000:.0f} ms")  # fmt: skip
    result["changelog_upload_fraction"] = round(log_rocks["fraction"], 4)
    result["changelog_upload_fraction_mean"] = round(log_rocks["mean"], 4)
    result["hashmap_changelog_upload_fraction"] = round(log_heap["fraction"], 4)
    result["hashmap_changelog_upload_fraction_mean"] = round(log_heap["mean"], 4)
    result["changelog_checkpoint_ms"] = {"rocksdb": round(log_rocks["duration"] * 1000, 1), "hashmap": round(log_heap["duration"] * 1000, 1)}

    s3, server = s3_transfer()
    try:
        restores = {
            "incremental": restore_times(small * 10, 3, False),
            "changelog": restore_times(small * 10, 3, True),
            "incremental_s3": restore_times(small * 10, 3, False, s3),
        }
    finally:
        server.stop()
    for name, r in restores.items():
        print(f"restore of {r['state_mb']:.0f} MiB rocksdb {name}: local copy {r['local'] * 1000:.0f} ms, checkpoint storage "
              f"{r['remote'] * 1000:.0f} ms")  # fmt: skip
    result["local_vs_remote_restore"] = round(restores["incremental_s3"]["local"] / restores["incremental_s3"]["remote"], 3)
    result["local_vs_folder_restore"] = round(restores["incremental"]["local"] / restores["incremental"]["remote"], 3)
    result["local_vs_folder_restore_changelog"] = round(restores["changelog"]["local"] / restores["changelog"]["remote"], 3)
    result["restore_ms"] = {f"{n}_{w}": round(r[w] * 1000, 1) for n, r in restores.items() for w in ("local", "remote")}

    records = 500_000 if args.quick else 2_000_000
    variants: dict[str, tuple[str, dict[str, Any]]] = {
        "hashmap": ("hashmap", {}),
        "rocksdb": ("rocksdb", {}),
        "rocksdb_no_cache": ("rocksdb", {"write_cache_ratio": 0.0}),
        "rocksdb_small_cache": ("rocksdb", {"memory": "16 mb"}),
    }
    rates: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for _ in range(2):  # alternated: the machine is shared
        for name, (kind, options) in variants.items():
            rates[name].append(throughput(kind, small, records, rng, **options))
    best = {k: max(r[0] for r in v) for k, v in rates.items()}
    best_cpu = {k: max(r[1] for r in v) for k, v in rates.items()}
    print("batch-wise keyed count (k rec/s, wall / cpu): " + ", ".join(
        f"{k} {best[k] / 1e3:.0f} / {best_cpu[k] / 1e3:.0f}" for k in variants))  # fmt: skip
    result["throughput_rec_s"] = {k: round(v) for k, v in best.items()}
    result["throughput_cpu_rec_s"] = {k: round(v) for k, v in best_cpu.items()}
    result["rocksdb_vs_hashmap"] = round(best["rocksdb"] / best["hashmap"], 3)
    for name in ("rocksdb_no_cache", "rocksdb_small_cache"):
        result[f"{name.replace('rocksdb', 'rocksdb_vs_hashmap')}"] = round(best[name] / best["hashmap"], 3)
    for name in ("rocksdb", "rocksdb_no_cache", "rocksdb_small_cache"):
        result[f"{name.replace('rocksdb', 'rocksdb_vs_hashmap')}_cpu"] = round(best_cpu[name] / best_cpu["hashmap"], 3)

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
    result["vs_quix"] = None
    result["not_measured"] = {"vs_quix": "needs the keyed Kafka job on the runtime (phase 2)"}
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
