"""``upsert_vs_append``: end-to-end throughput of a change-data job into a table in upsert mode / the same job
appending the same events, Delta and Iceberg (used by benchmarks/upserts.py).

Both jobs read the same change events from an in-process source (``--e2e-events`` events over two splits,
each split a key space of its own: first a snapshot read of each of its ``--e2e-keys`` keys, then 80%
updates, 10% deletes and 10% inserts of keys drawn over the key space) and run on the local runtime,
parallelism 2, checkpoints every ``--e2e-interval`` seconds (10 by default). The append job writes every
event as a row; the upsert job collapses each checkpoint's changes per key and merges them into the table.
Throughput is events / time of the whole run (start to finished job: its last commit visible), the two jobs
alternated over ``--rounds`` rounds after an untimed warm-up run of each (benchmarks/_common.py); the ratio
is upsert / append per round, reported as the median and spread of the rounds by the named metric (wall time
by default; CPU time of the process tree beside). Every run's table is compared with what it must hold:
the upsert table, row by row and column by column, with a replay of the same events by DuckDB
(``_common.replay_changes``); the append table with the events themselves.
Kafka is left out: decoding costs both jobs the same (docs/kafka.md measures the change formats).
"""

from __future__ import annotations

import functools
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from _common import Stopwatch, Timing, alternate, ratios, replay_changes, same_table, with_runs  # type: ignore[import-not-found]
from sluice import CheckpointConfig, NoRestart, Pipeline
from sluice.changes import OP, ORDER, Op, with_keys
from sluice.connectors.generator import GeneratorSource

from tests.sinks.tables.helpers import Target

SPLITS = 2

#: the tables measured: Delta, Iceberg copy-on-write, Iceberg merge-on-read (``sink`` options added in upsert mode)
FORMATS: dict[str, tuple[str, dict[str, Any]]] = {
    "delta": ("delta", {}),
    "iceberg": ("iceberg", {}),
    "iceberg_mor": ("iceberg", {"write_mode": "merge-on-read", "key_columns": ["id"]}),
}


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


ROW_COLUMNS = ["id", "name", "amount", "kind", "ts"]


def all_events(events: int, keys: int) -> pa.Table:
    """Every event the job reads (both splits; each split's key space is its own, so per key the order is
    its split's)."""
    per = events // SPLITS
    return pa.Table.from_batches([change_batch(split, 0, per, keys) for split in range(SPLITS)])


def expected_tables(events: int, keys: int) -> dict[str, pa.Table]:
    """What each job's table must hold: every event as a row (append), the replay of the events by DuckDB
    (upsert)."""
    changes = all_events(events, keys)
    rows = changes.select(ROW_COLUMNS)
    return {"append": rows, "upsert": replay_changes(rows.schema.empty_table(), [changes])}


def run_job(
    kind: str, mode: str, work: Path, events: int, keys: int, interval: float, batch: int, expected: pa.Table
) -> tuple[Timing, dict[str, Any]]:
    fmt, extra = FORMATS[kind]
    target = Target(fmt, str(work / "lake"), {}, str(work))
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
    p.source(source, parallelism=SPLITS).sink(target.sink(mode=mode, **(extra if mode == "upsert" else {})), parallelism=SPLITS)
    with Stopwatch() as sw:  # start to finished job: its last commit is visible when run() returns
        result = p.run(runtime="local", restore="none")
    got = target.read()
    differs = same_table(got.select(ROW_COLUMNS), expected, keys=("id", "ts"))
    assert differs is None, f"{kind} {mode}: the table differs from the events' {mode} ({differs})"
    checkpoints = result.checkpoint_counts.completed
    return sw.timing, {"events_per_s": round(events / sw.timing.wall), "checkpoints": checkpoints, "rows": got.num_rows}


def upsert_vs_append(
    root: Path, events: int, keys: int, interval: float, batch: int, rounds: int, metric: str, warmup: bool = True,
    formats: tuple[str, ...] = tuple(FORMATS),
) -> dict[str, Any]:
    """Per format: every round of both jobs and the ratio upsert / append (median, spread, rounds)."""
    out: dict[str, Any] = {}
    expected = expected_tables(events, keys)
    small = expected_tables(20_000, 2_000)
    for kind in formats:
        info: dict[str, list[dict[str, Any]]] = {"append": [], "upsert": []}

        def run(mode: str, r: int, kind: str = kind, info: dict[str, list[dict[str, Any]]] = info) -> Timing:
            work = root / f"e2e-{kind}-{mode}-{r}"
            work.mkdir(parents=True)
            try:
                if r == 0:  # warm-up: imports, first table creation, thread pools (a small run, checked too)
                    return run_job(kind, mode, work, 20_000, 2_000, 1.0, batch, small[mode])[0]
                timing, figures = run_job(kind, mode, work, events, keys, interval, batch, expected[mode])
                info[mode].append(figures)
                return timing
            finally:  # each run's table and checkpoints go once checked (30M events: several GB a run)
                shutil.rmtree(work, ignore_errors=True)

        print(f"e2e {kind}: append and upsert of {events:,} events, alternated", flush=True)
        timings = alternate(["append", "upsert"], rounds, run, warmup=warmup)
        res: dict[str, Any] = {"jobs": info}
        target = ">= 0.8" if kind == "iceberg_mor" else ">= 0.5"  # issue 36's target for merge-on-read
        ratios(res, "upsert_vs_append", timings["upsert"], timings["append"], metric, target)
        with_runs(res, "timings_wall_cpu", timings)
        out[kind] = res
    return out
