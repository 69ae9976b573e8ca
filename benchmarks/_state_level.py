"""The backend-level part of ``benchmarks/state_backends.py``: the keyed backends driven directly (no job,
no Kafka), a batch-wise keyed count over int64 keys, 1% of the keys changed per checkpoint. Its figures go
into the RESULT under ``backend_*`` keys; the job-level figures are in :mod:`_state_job`.

* incremental and changelog upload fractions, checkpoint duration growth (``incremental_run``,
  ``changelog_run``); restore from a local copy / from S3 on moto (``restore_times``); throughput of the
  batch-wise count with the write-back cache on, off and small (``throughput``).
"""

from __future__ import annotations

import logging
import os
import statistics
import tempfile
import time
from typing import Any

import numpy as np
import pyarrow as pa
from _common import Stopwatch, Timing, alternate, ratios, report  # type: ignore[import-not-found]
from sluice.state.api import ValueStateDescriptor
from sluice.state.config import StateBackendConfig
from sluice.state.factory import create_state_backend
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
    be: KeyedStateBackend = create_state_backend(config).create_keyed_backend("bench", key_group_range(MAX_PARALLELISM, 1, 0), MAX_PARALLELISM, transfer)
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
    return {"fraction": statistics.median(fractions), "mean": statistics.fmean(fractions), "duration": statistics.median(durations)}


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


def restore_times(keys: int, rounds: int, changelog: bool, transfer: Any = None) -> dict[str, Any]:
    """Restore a RocksDB subtask of ``keys`` keys from its local copy and from checkpoint storage, alternated
    ``rounds`` times; every time of each."""
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
    return {"local": times["local"], "remote": times["remote"], "state_mb": state_mb}


def throughput(kind: str, keys: int, stream: np.ndarray, **options: Any) -> Timing:
    """The keyed count of ``stream`` over ``keys`` loaded keys, including a checkpoint's synchronous part at
    the end: wall and process-tree CPU time. Checked: every key's count equals the input's."""
    with tempfile.TemporaryDirectory() as root:
        be = backend(kind, root, **options)
        count(be, np.arange(keys, dtype=np.int64))
        be.snapshot(1).discard()
        with Stopwatch() as sw:
            count(be, stream)
            snap = be.snapshot(2)
        snap.discard()
        got = be.batch_state(COUNT).get(be.key_batch([pa.array(np.arange(keys, dtype=np.int64))]))
        want = np.ones(keys, dtype=np.int64)  # the load, then one per batch a key is in (count() reads, adds 1, writes)
        for at in range(0, len(stream), 10_000):
            want[np.unique(stream[at : at + 10_000])] += 1
        if not np.array_equal(got.to_numpy(zero_copy_only=False), want):
            raise RuntimeError(f"backend-level {kind}: counts differ from the input's")
        be.dispose()
    return sw.timing


def backend_level(quick: bool, rng: np.random.Generator, rounds: int = 3, metric: str = "wall") -> dict[str, Any]:
    """The backend-level figures, keys prefixed ``backend_``."""
    small = 100_000 if quick else 300_000
    changes = 5 if quick else 9  # checkpoints after 1% of the keys changed (``rounds``: alternated rounds)
    result: dict[str, Any] = {}
    inc_1x = incremental_run("rocksdb", small, changes, rng)
    inc_10x = incremental_run("rocksdb", small * 10, changes, rng)
    print(f"[backend] rocksdb incremental: upload fraction {inc_1x['fraction']:.3f} at {small} keys, {inc_10x['fraction']:.3f} "
          f"at {small * 10}; checkpoint {inc_1x['duration'] * 1000:.0f} -> {inc_10x['duration'] * 1000:.0f} ms", flush=True)  # fmt: skip
    result["backend_incremental_upload_fraction"] = round(inc_10x["fraction"], 4)
    result["backend_incremental_upload_fraction_mean"] = round(inc_10x["mean"], 4)
    result["backend_checkpoint_growth"] = round(inc_10x["duration"] / inc_1x["duration"], 2)
    log_rocks = changelog_run("rocksdb", small * 10, changes * 2, rng)
    print(f"[backend] rocksdb changelog: upload fraction {log_rocks['fraction']:.4f} (mean with materializations "
          f"{log_rocks['mean']:.4f}) at {small * 10} keys", flush=True)  # fmt: skip
    result["backend_changelog_upload_fraction"] = round(log_rocks["fraction"], 4)
    result["backend_changelog_upload_fraction_mean"] = round(log_rocks["mean"], 4)
    s3, server = s3_transfer()
    try:
        r = restore_times(small * 10, rounds, False, s3)
    finally:
        server.stop()
    print(f"[backend] restore of {r['state_mb']:.0f} MiB: local copy {', '.join(f'{t * 1000:.0f}' for t in r['local'])} ms, "
          f"S3 {', '.join(f'{t * 1000:.0f}' for t in r['remote'])} ms", flush=True)  # fmt: skip
    report(result, "backend_local_vs_remote_restore", [a / b for a, b in zip(r["local"], r["remote"], strict=True)], "<= 0.3")
    records = 500_000 if quick else 2_000_000
    stream = rng.integers(0, small, size=records, dtype=np.int64)  # the same records for both backends
    print(f"[backend] batch-wise keyed count of {records:,} records over {small:,} keys, alternated rounds:", flush=True)
    timings = alternate(["hashmap", "rocksdb"], rounds, lambda kind, _r: throughput(kind, small, stream))
    ratios(result, "backend_rocksdb_vs_hashmap", timings["rocksdb"], timings["hashmap"], metric, ">= 0.5")
    return result
