"""``upsert_vs_append``: end-to-end throughput of a change-data job into a table in upsert mode / the same job
appending the same events, Delta and Iceberg (used by benchmarks/upserts.py).

Both jobs read the same change events from an in-process source (``--e2e-events`` events over two splits,
each split a key space of its own: first a snapshot read of each of its ``--e2e-keys`` keys, then 80%
updates, 10% deletes and 10% inserts of keys drawn over the key space) and run on the local runtime,
parallelism 2, checkpoints every ``--e2e-interval`` seconds (10 by default). The append job writes every
event as a row; the upsert job collapses each checkpoint's changes per key and merges them into the table.
Throughput is events / wall time of the whole run (start to finished job, after a small warm-up run of
each); the ratio is upsert / append.
Kafka is left out: decoding costs both jobs the same (docs/kafka.md measures the change formats).
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from sluice import CheckpointConfig, NoRestart, Pipeline
from sluice.changes import OP, ORDER, Op, with_keys
from sluice.connectors.generator import GeneratorSource

from tests.sinks.tables.helpers import Target

SPLITS = 2


def change_batch(split: int, start: int, end: int, keys: int) -> pa.RecordBatch:
    """Events ``start..end`` of ``split``: snapshot reads of keys ``0..keys-1``, then random changes."""
    seq = np.arange(start, end, dtype=np.int64)
    drawn = (seq * 2654435761 + split * 97) % (1 << 31)
    local = np.where(seq < keys, seq, drawn % keys)
    r = drawn % 10
    ops = np.where(seq < keys, int(Op.READ), np.select([r < 1, r < 2], [int(Op.DELETE), int(Op.INSERT)], int(Op.UPDATE)))
    ids = split * keys + local
    n = len(seq)
    return with_keys(
        pa.RecordBatch.from_arrays(
            [
                pa.array(ids),
                pa.array(np.char.add("name-", (seq % 100_000).astype(str)).astype(object), pa.string()),
                pa.array((seq % 1000) * 1.25),
                pa.array(np.char.add("k", (ids % 7).astype(str)).astype(object), pa.string()),
                pa.array(np.full(n, 1_700_000_000_000, np.int64) + seq),
                pa.array(ops.astype(np.int8)),
                pa.array(seq),
            ],
            names=["id", "name", "amount", "kind", "ts", OP, ORDER],
        ),
        ["id"],
    )


def live_keys(events: int, keys: int) -> int:
    """How many keys the whole stream leaves (the last change per key not a delete), computed apart."""
    per = events // SPLITS
    live = 0
    for split in range(SPLITS):
        b = change_batch(split, 0, per, keys)
        ids = b.column("id").to_numpy()[::-1]
        ops = b.column(OP).to_numpy()[::-1]
        _, first = np.unique(ids, return_index=True)  # reversed: the first occurrence is the last change
        live += int(np.sum(ops[first] != int(Op.DELETE)))
    return live


def run_job(kind: str, mode: str, work: Path, events: int, keys: int, interval: float, batch: int) -> dict[str, Any]:
    target = Target(kind, str(work / "lake"), {}, str(work))
    source = GeneratorSource(
        num_splits=SPLITS,
        records_per_split=events // SPLITS,
        batch_size=batch,
        rows=functools.partial(change_batch, keys=keys),
        name="changes",
    )
    p = Pipeline(
        f"e2e-{kind}-{mode}",
        checkpoint=CheckpointConfig(interval=interval, storage=str(work / "chk")),
        restart=NoRestart(),
    )
    p.source(source, parallelism=SPLITS).sink(target.sink(mode=mode), parallelism=SPLITS)
    t0 = time.perf_counter()
    result = p.run(runtime="local", restore="none")
    elapsed = time.perf_counter() - t0
    rows = target.read().num_rows
    expected = live_keys(events, keys) if mode == "upsert" else events
    assert rows == expected, f"{kind} {mode}: {rows} rows in the table, expected {expected}"
    checkpoints = result.checkpoint_counts.completed
    return {"seconds": round(elapsed, 1), "events_per_s": round(events / elapsed), "checkpoints": checkpoints,
            "rows": rows}


def upsert_vs_append(root: Path, events: int, keys: int, interval: float, batch: int) -> dict[str, Any]:
    """Per format: both jobs' figures and the throughput ratio upsert / append."""
    out: dict[str, Any] = {}
    for kind in ("delta", "iceberg"):
        for mode in ("append", "upsert"):  # warm-up: imports, first table creation, thread pools
            (root / f"warm-{kind}-{mode}").mkdir(parents=True)
            run_job(kind, mode, root / f"warm-{kind}-{mode}", 20_000, 2_000, 1.0, batch)
        runs = {}
        for mode in ("append", "upsert"):
            work = root / f"e2e-{kind}-{mode}"
            work.mkdir(parents=True)
            runs[mode] = run_job(kind, mode, work, events, keys, interval, batch)
            print(f"e2e {kind} {mode}: {runs[mode]}", flush=True)
        ratio = runs["upsert"]["events_per_s"] / runs["append"]["events_per_s"]
        out[kind] = {**runs, "upsert_vs_append": round(ratio, 3)}
    return out
