"""The hashmap backend's full snapshot of one value state: the bulk path against the per-entry path.

Fills a hashmap keyed backend (128 key groups) with ``--entries`` keys (int64) of a value state with the
``binary`` serializer (48-byte values, the enrichment join's one encoded row per key), then times
``snapshot(...).run()`` (the asynchronous part of a checkpoint: the canonical Arrow IPC stream per key
group) by this process's CPU time, alternating the bulk path (:mod:`sluice.state.hashmap.bulk`) with the
per-entry path it replaces, best of ``--repeat`` each; checks both wrote the same bytes.

    python benchmarks/hashmap_snapshot.py [--entries 1000000] [--repeat 3]

The last line is ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from typing import Any

import pyarrow as pa
from sluice.state.api import ValueStateDescriptor
from sluice.state.hashmap import backend as hashmap_backend
from sluice.state.keygroups import KeyGroupRange, hash_columns, key_groups
from sluice.state.transfer import LocalFileTransfer

MAX_PARALLELISM = 128


def snapshot_cpu(be: hashmap_backend.HashMapKeyedStateBackend, bulk: bool) -> tuple[float, dict[str, Any]]:
    """CPU seconds of one full snapshot, and its handle."""
    original = hashmap_backend.bulk_rows
    if not bulk:
        hashmap_backend.bulk_rows = lambda reg, data: None  # type: ignore[assignment]
    try:
        c0 = time.process_time()
        handle = be.snapshot(1).run()
        return time.process_time() - c0, handle
    finally:
        hashmap_backend.bulk_rows = original


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    be = hashmap_backend.HashMapStateBackend().create_keyed_backend(
        "bench", KeyGroupRange(0, MAX_PARALLELISM), MAX_PARALLELISM, LocalFileTransfer(tempfile.mkdtemp())
    )
    desc = ValueStateDescriptor("row", serializer="binary")
    groups = key_groups(hash_columns([pa.array(range(args.entries), pa.int64())]), MAX_PARALLELISM).tolist()
    for key, kg in enumerate(groups):
        be.set_current_key(key, kg)
        be.state(desc).update(b"r" * 40 + key.to_bytes(8, "big"))
    best: dict[str, float] = {"bulk": float("inf"), "per_entry": float("inf")}
    handles: dict[str, dict[str, Any]] = {}
    for _ in range(args.repeat):
        for name in best:
            cpu, handles[name] = snapshot_cpu(be, bulk=name == "bulk")
            best[name] = min(best[name], cpu)
            print(f"  {name:10s} {cpu:.3f} CPU-s", flush=True)
    if handles["bulk"] != handles["per_entry"]:
        raise RuntimeError("the bulk path wrote other bytes than the per-entry path")
    result = {
        "entries": args.entries,
        "snapshot_cpu_s": {k: round(v, 3) for k, v in best.items()},
        "per_entry_vs_bulk": round(best["per_entry"] / best["bulk"], 2),
    }
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
