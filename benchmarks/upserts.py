"""Upserts into Delta and Iceberg: the merge of one checkpoint's changes, measured in one run.

Builds a ``--rows`` (default 10,000,000) row table of each format (``id`` int64 key, two strings, a float,
an int64), written in ``--files`` files of consecutive ids, as appends leave it. Then, for each of
``--checkpoints`` checkpoints, ``--changes`` (default 100,000) changes: 80% updates and 10% deletes of
existing keys, 10% inserts of new keys, each change staged as the upsert sink's writers do (collapsed, a
Parquet file per writer) and committed as its global commit does (staged files read and collapsed, one
merge, staged files deleted). ``--hot`` (default 1.0) is the share of the key space updates and deletes
fall in (the newest ids); 1.0 spreads them over the whole table, the worst case for copy-on-write: every
data file holds changed keys.

Reports, per format, the commit time of each checkpoint and its median (``delta_merge_s``,
``iceberg_merge_s``; no peer: the merge alone) and what the Iceberg merge read and replaced; after every
checkpoint each table is compared, row by row and column by column, with a replay of the changes by DuckDB
(``_common.replay_changes``).

``iceberg_vs_pyiceberg_upsert`` (target <= 0.1): sluice's Iceberg merge of the first checkpoint's changes
against pyiceberg's best path for the same copy-on-write upsert, ``overwrite`` of the changed rows with an
``In`` filter over the changed keys in one transaction (``pyiceberg_overwrite``), a time ratio (sluice /
pyiceberg) per round, the median and spread of the rounds by the named metric (``--metric``, wall time by
default; CPU time of the process tree beside). pyiceberg's slower ``delete`` + ``upsert`` in one
transaction (``pyiceberg_upsert``) runs in the same rounds and is reported beside
(``iceberg_vs_pyiceberg_delete_upsert``), never instead. Each side writes its own copy of one table
(registered from the same metadata: same files, same snapshot), the three sides alternated over ``--rounds``
rounds (rotated order) after an untimed warm-up of each; every side's table is compared with the replay in
every round.

``upsert_vs_append`` (per format, and the lower of the two): end-to-end throughput of a change-data job into
the sink in upsert mode, 10 s checkpoints, / the same job appending the same events, alternated rounds
(benchmarks/upsert_e2e.py; ``--e2e-events``, ``--e2e-keys``; ``--e2e-only`` skips the merge figures,
``--skip-e2e`` this one). Target >= 0.5. Last line: ``RESULT {json}`` (every ratio with ``<key>_runs`` and
``<key>_spread``).

Usage: python benchmarks/upserts.py [--quick] [--rows 10000000] [--changes 100000] [--checkpoints 3]
       [--files 10] [--hot 1.0] [--rounds 3] [--metric wall|cpu] [--skip-pyiceberg] [--e2e-events 4000000]
       [--e2e-keys 500000] [--e2e-interval 10] [--e2e-only | --skip-e2e]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import (  # type: ignore[import-not-found]
    Stopwatch,
    Timing,
    add_round_options,
    alternate,
    check_rounds,
    load_average,
    ratios,
    replay_changes,
    same_table,
    with_runs,
)
from sluice.sinks.iceberg.upsert import pyiceberg_overwrite, pyiceberg_upsert
from sluice.sinks.tables.changes import Op, change_table

from benchmarks.upsert_e2e import upsert_vs_append
from tests.sinks.tables.helpers import Target
from tests.sinks.tables.upserts import Upserts

SCHEMA = pa.schema(
    [("id", pa.int64()), ("name", pa.string()), ("amount", pa.float64()), ("kind", pa.string()), ("ts", pa.int64())]
)


def rows(ids: np.ndarray[Any, Any], version: int) -> pa.Table:
    n = len(ids)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pc.binary_join_element_wise(pa.array(np.full(n, f"v{version}-")), pa.array(ids).cast(pa.string()), ""),
            "amount": pa.array((ids % 1000) * 1.5 + version, pa.float64()),
            "kind": pa.array(np.char.add("k", (ids % 7).astype(str)).astype(object), pa.string()),
            "ts": pa.array(np.full(n, 1_700_000_000_000 + version), pa.int64()),
        },
        schema=SCHEMA,
    )


def build(up: Upserts, n: int, files: int) -> float:
    """Write the initial table: ``files`` appends of consecutive ids."""
    t0 = time.perf_counter()
    step = -(-n // files)
    if up.target.kind == "delta":
        from deltalake import write_deltalake

        for start in range(0, n, step):
            write_deltalake(up.table_uri, rows(np.arange(start, min(n, start + step)), 0), mode="append")
    else:
        table = up.load_iceberg(SCHEMA)
        for start in range(0, n, step):
            table.append(rows(np.arange(start, min(n, start + step)), 0).cast(table.schema().as_arrow()))
    return time.perf_counter() - t0


def change_sets(n: int, changes: int, checkpoints: int, hot: float, seed: int = 7) -> list[pa.Table]:
    """Per checkpoint: 80% updates and 10% deletes of live keys (in the newest ``hot`` share of the key
    space), 10% inserts of new keys; source order = position."""
    rng = np.random.default_rng(seed)
    live = np.ones(n + changes * checkpoints, dtype=bool)
    live[n:] = False
    next_id, order, out = n, 0, []
    for cp in range(checkpoints):
        lo = int(next_id * (1 - hot))
        pool = np.flatnonzero(live[lo:next_id]) + lo
        picked = rng.choice(pool, int(changes * 0.9), replace=False)
        upd, dele = picked[: int(changes * 0.8)], picked[int(changes * 0.8) :]
        ins = np.arange(next_id, next_id + changes - len(picked))
        next_id += len(ins)
        live[dele] = False
        live[ins] = True
        ids = np.concatenate([upd, dele, ins])
        ops = np.concatenate([np.full(len(upd), Op.UPDATE), np.full(len(dele), Op.DELETE), np.full(len(ins), Op.INSERT)])
        perm = rng.permutation(len(ids))
        body = rows(ids[perm], cp + 1)
        out.append(change_table(body, ops[perm].astype(np.int8), np.arange(order, order + len(ids))))
        order += len(ids)
    return out


def replays(n: int, sets: list[pa.Table]) -> list[pa.Table]:
    """The table after each checkpoint's changes, replayed by DuckDB from the initial rows (apart from the
    merge code under test)."""
    state, out = rows(np.arange(n), 0), []
    for changes in sets:
        state = replay_changes(state, [changes])
        out.append(state)
    return out


def check(label: str, got: pa.Table, expected: pa.Table) -> None:
    differs = same_table(got, expected)
    if differs is not None:
        raise RuntimeError(f"{label}: the table differs from the replay of the changes ({differs})")


def run_format(kind: str, root: Path, args: argparse.Namespace, sets: list[pa.Table], expected: list[pa.Table]) -> dict[str, Any]:
    work = root / kind
    work.mkdir(parents=True)
    up = Upserts(Target(kind, str(work / "lake"), {}, str(work)))
    built = build(up, args.rows, args.files)
    print(f"{kind}: table of {args.rows:,} rows written in {built:.1f} s", flush=True)
    times, details = [], []
    for cid, changes in enumerate(sets, start=1):
        files = [up.stage(cid, changes.slice(i, len(changes) // 2 + 1), sub) for sub, i in enumerate((0, len(changes) // 2 + 1))]
        t0 = time.perf_counter()
        outcome = up.commit(cid, files)
        times.append(time.perf_counter() - t0)
        assert outcome.value == "committed", outcome
        last = getattr(up.engine, "last", None)
        if last is not None:
            details.append({"files_read": last.files_read, "files_replaced": len(last.replaced),
                            "files_added": len(last.added), "rows_copied": last.rows_copied})
        print(f"{kind} checkpoint {cid}: {times[-1]:.2f} s {details[-1] if details else ''}", flush=True)
        check(f"{kind} after checkpoint {cid}", up.target.read(), expected[cid - 1])
    res: dict[str, Any] = {"commit_s": [round(t, 2) for t in times], "median_s": round(statistics.median(times), 2),
                           "build_s": round(built, 1)}
    if details:
        res["merges"] = details
    return res


#: the sides of ``iceberg_vs_pyiceberg_upsert``: sluice's merge, pyiceberg's best path, its slower path
SIDES = ("sluice", "pyiceberg_overwrite", "pyiceberg_delete_upsert")


def pyiceberg_rounds(root: Path, args: argparse.Namespace, changes: pa.Table, expected: pa.Table) -> dict[str, Any]:
    """sluice's merge, pyiceberg's one-call ``overwrite`` and its ``delete`` + ``upsert`` of the same changes,
    each into its own copy of one table (registered from the same metadata: same files, same snapshot),
    alternated over ``--rounds`` rounds after a warm-up of each; every table compared with the replay."""
    from sluice.sinks.iceberg.upsert import IcebergUpsert
    from sluice.sinks.tables.changes import collapse

    work = root / "pyiceberg"
    work.mkdir(parents=True)
    up = Upserts(Target("iceberg", str(work / "lake"), {}, str(work)))
    build(up, args.rows, args.files)
    catalog = up.catalog()
    base = catalog.load_table("db.events").metadata_location
    collapsed = collapse(changes, ["id"])
    props = {"sluice.max-committed-checkpoint-id": "1"}

    def run(who: str, r: int) -> Timing:
        name = f"db.{who}_{r}"
        table = catalog.register_table(name, base)
        with Stopwatch() as sw:
            if who == "sluice":
                engine = IcebergUpsert(lambda _s: catalog.load_table(name), ("id",), "bench", "sink")
                assert engine.apply(1, collapsed).value == "committed"
            elif who == "pyiceberg_overwrite":
                pyiceberg_overwrite(table, collapsed, ["id"], props)
            else:
                pyiceberg_upsert(table, collapsed, ["id"], props)
        check(f"{who}, round {r}", catalog.load_table(name).scan().to_arrow(), expected)
        catalog.drop_table(name)  # its files stay: the next copy registers the base metadata again
        return sw.timing

    timings = alternate(SIDES, args.rounds, run, warmup=not args.no_warmup)
    out: dict[str, Any] = {}
    ratios(out, "iceberg_vs_pyiceberg_upsert", timings["sluice"], timings["pyiceberg_overwrite"], args.metric,
           "<= 0.1", of="time")  # fmt: skip
    ratios(out, "iceberg_vs_pyiceberg_delete_upsert", timings["sluice"], timings["pyiceberg_delete_upsert"],
           args.metric, of="time")  # fmt: skip
    with_runs(out, "pyiceberg_rounds_wall_cpu", timings)
    for who in SIDES:
        out[f"{who}_s"] = round(statistics.median(t.of(args.metric) for t in timings[who]), 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes: 200k rows, 20k changes, 40k e2e events")
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--changes", type=int, default=100_000)
    ap.add_argument("--checkpoints", type=int, default=3)
    ap.add_argument("--files", type=int, default=10)
    ap.add_argument("--hot", type=float, default=1.0)
    add_round_options(ap)
    ap.add_argument("--skip-pyiceberg", action="store_true")
    ap.add_argument("--e2e-events", type=int, default=4_000_000)
    ap.add_argument("--e2e-keys", type=int, default=500_000, help="keys per split")
    ap.add_argument("--e2e-interval", type=float, default=10.0)
    ap.add_argument("--e2e-batch", type=int, default=10_000)
    ap.add_argument("--e2e-only", action="store_true")
    ap.add_argument("--skip-e2e", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.rows, args.changes, args.e2e_events, args.e2e_keys, args.e2e_interval = 200_000, 20_000, 40_000, 5_000, 1.0
    check_rounds(args)
    root = Path(tempfile.mkdtemp(prefix="sluice-upserts-bench-"))
    result: dict[str, Any] = {"metric": args.metric, "rounds": args.rounds, "loadavg_before": load_average()}
    try:
        if not args.skip_e2e:
            e2e = upsert_vs_append(root, args.e2e_events, args.e2e_keys, args.e2e_interval, args.e2e_batch,
                                   args.rounds, args.metric, warmup=not args.no_warmup)  # fmt: skip
            result["e2e"] = e2e
            worse = min(("delta", "iceberg"), key=lambda k: e2e[k]["upsert_vs_append"])
            for suffix in ("", "_runs", "_spread"):  # the lower of the two formats' medians, and its rounds
                result[f"upsert_vs_append{suffix}"] = e2e[worse][f"upsert_vs_append{suffix}"]
            result["upsert_vs_append_format"] = worse
            result.update(e2e_events=args.e2e_events, e2e_keys=args.e2e_keys, e2e_interval=args.e2e_interval)
        if not args.e2e_only:
            sets = change_sets(args.rows, args.changes, args.checkpoints, args.hot)
            expected = replays(args.rows, sets)
            for kind in ("delta", "iceberg"):
                result[kind] = run_format(kind, root, args, sets, expected)
                shutil.rmtree(root / kind, ignore_errors=True)
            result["delta_merge_s"] = result["delta"]["median_s"]
            result["iceberg_merge_s"] = result["iceberg"]["median_s"]
            if not args.skip_pyiceberg:
                result.update(pyiceberg_rounds(root, args, sets[0], expected[0]))
            result.update(rows=args.rows, changes=args.changes, checkpoints=args.checkpoints, files=args.files,
                          hot=args.hot)  # fmt: skip
        result["loadavg_after"] = load_average()
        print("RESULT " + json.dumps(result))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
