"""The cost of the signed checkpoint format against the pickle it replaced (issue 22), in the same run.

For three task states (in-flight data: channel state sections; keyed state: key-group blobs; a source and a
sink: splits and committables through their JSON serializers), time the write (serialize + sign) and the
read (verify + decode + deserialize) of one task state file with ``sluice.checkpoint.payload`` and with
``pickle`` of the same objects (what the old format did), alternating, and report the new/old ratios (the
machine is shared: only same-run ratios mean something) and the new format's MB/s.

Usage: python benchmarks/checkpoint_format.py [--repeats R]
Last line: RESULT {json}
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from sluice.checkpoint.channel_state import write_ipc
from sluice.checkpoint.codec import envelope, open_envelope
from sluice.checkpoint.payload import decode_task_state, encode_task_state
from sluice.connectors.kafka.offsets import KafkaSplit
from sluice.connectors.kafka.serializers import KafkaSplitSerializer
from sluice.sinks.files import FileCommittable
from sluice.sinks.files.serializers import FileCommittableSerializer

KEY = os.urandom(32)
EMPTY: dict[str, Any] = {"splits": None, "input_state": [], "output_state": []}


class Case:
    """A task state: how each format writes it from the live objects and reads it back."""

    def __init__(self, name: str, new: Callable[[], dict[str, Any]], old: dict[str, Any],
                 after_read: Callable[[dict[str, Any]], None] = lambda p: None) -> None:
        self.name, self.new, self.old, self.after_read = name, new, old, after_read

    def write_new(self) -> bytes:
        return encode_task_state(self.new(), KEY)

    def write_old(self) -> bytes:
        return pickle.dumps(self.old, protocol=5)

    def read_new(self, data: bytes) -> None:
        self.after_read(decode_task_state(data, KEY, self.name))

    def read_old(self, data: bytes) -> None:
        pickle.loads(data)


def channel_state() -> Case:
    """64 in-flight batches of 4096 rows (~110 KiB of Arrow IPC each) on two outputs (both formats store
    the IPC bytes the task encoded before either format runs)."""
    batch = pa.RecordBatch.from_pydict(
        {"id": pa.array(range(4096), pa.int64()), "v": [1.5] * 4096, "s": [f"row-{i}" for i in range(4096)]}
    )
    ipc = [(i % 2, write_ipc(batch)) for i in range(64)]
    state = {"operators": {"map": {"keyed": {}, "operator": None}}, "splits": None,
             "input_state": ipc[:32], "output_state": ipc[32:]}
    return Case("channel state", lambda: state, state)


def keyed_state() -> Case:
    """128 key groups of pickled user state (~60 KiB each): both formats store the same blobs."""
    blobs = {kg: pickle.dumps({"count": {f"k{kg}-{i}": i for i in range(4000)}}, protocol=5) for kg in range(128)}
    state = {"operators": {"counter": {"keyed": blobs, "operator": []}}, **EMPTY}
    return Case("keyed state", lambda: state, state)


def connectors() -> Case:
    """A Kafka reader's 32 splits and a file sink's 200 pending committables (JSON serializers vs pickle)."""
    schema = pa.schema([("id", pa.int64()), ("p", pa.int64())])
    splits = [KafkaSplit(f"events:{p}", 1_000_000 + p, None, value_schema=schema) for p in range(32)]
    comms = [
        FileCommittable(f"dt={i % 7}", f"dt={i % 7}/part-j-{i:06d}.parquet", f"dt={i % 7}/.part-j-{i:06d}.a0.pending",
                        4_000_000, 50_000, 12, "abcdef0123456789")
        for i in range(200)
    ]
    ks, fs = KafkaSplitSerializer(), FileCommittableSerializer()

    def new() -> dict[str, Any]:
        pending = [[12, [envelope(fs, c) for c in comms]]]
        return {"operators": {"sink": {"keyed": {}, "operator": {"writer": None, "pending": pending}}},
                **EMPTY, "splits": [envelope(ks, s) for s in splits]}

    def deserialize(p: dict[str, Any]) -> None:  # what a restore does with them
        for env in p["splits"]:
            open_envelope(ks, env, "split")
        for _, group in p["operators"]["sink"]["operator"]["pending"]:
            for env in group:
                open_envelope(fs, env, "committable")

    old = {"operators": {"sink": {"keyed": {}, "operator": {"writer": None, "pending": {12: comms}}}},
           **EMPTY, "splits": splits}
    return Case("kafka + file sink", new, old, deserialize)


def _best(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def measure(case: Case, repeats: int) -> dict[str, Any]:
    data_new, data_old = case.write_new(), case.write_old()
    ratios: dict[str, list[float]] = {"write": [], "read": []}
    best = {"write": float("inf"), "read": float("inf"), "write_old": float("inf"), "read_old": float("inf")}
    for _ in range(3):  # alternate, so both formats see the same machine load
        w, wo = _best(case.write_new, repeats), _best(case.write_old, repeats)
        r, ro = _best(lambda: case.read_new(data_new), repeats), _best(lambda: case.read_old(data_old), repeats)
        ratios["write"].append(w / wo)
        ratios["read"].append(r / ro)
        for k, v in (("write", w), ("read", r), ("write_old", wo), ("read_old", ro)):
            best[k] = min(best[k], v)
    return {
        "case": case.name,
        "bytes_new": len(data_new),
        "bytes_old": len(data_old),
        "write_new_over_old": round(statistics.median(ratios["write"]), 2),
        "read_new_over_old": round(statistics.median(ratios["read"]), 2),
        "write_ms_new_old": (round(best["write"] * 1e3, 2), round(best["write_old"] * 1e3, 2)),
        "read_ms_new_old": (round(best["read"] * 1e3, 2), round(best["read_old"] * 1e3, 2)),
        "write_MBps_new": round(len(data_new) / best["write"] / 1e6, 1),
        "read_MBps_new": round(len(data_new) / best["read"] / 1e6, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    results = [measure(make(), args.repeats) for make in (channel_state, keyed_state, connectors)]
    for r in results:
        print(r)
    print("RESULT " + json.dumps(results))


if __name__ == "__main__":
    main()
