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
``iceberg_merge_s``), what the Iceberg merge read and replaced, and ``iceberg_vs_pyiceberg_upsert``: the
median time of sluice's Iceberg merge of the first checkpoint's changes / that of pyiceberg's ``delete`` +
``upsert`` (in one transaction) of the same changes, each into its own copy of one table (registered from the
same metadata), alternating over ``--rounds`` rounds (target <= 0.1). The Delta and the Iceberg table are
compared after every checkpoint, and sluice's and pyiceberg's result in every round.

``upsert_vs_append`` (per format, and the lower of the two): end-to-end throughput of a change-data job into
the sink in upsert mode, 10 s checkpoints, / the same job appending the same events
(benchmarks/upsert_e2e.py; ``--e2e-events``, ``--e2e-keys``; ``--e2e-only`` skips the merge figures,
``--skip-e2e`` this one). Target >= 0.5. Last line: ``RESULT {json}``.

Usage: python benchmarks/upserts.py [--rows 10000000] [--changes 100000] [--checkpoints 3] [--files 10]
       [--hot 1.0] [--rounds 3] [--skip-pyiceberg] [--e2e-events 4000000] [--e2e-keys 500000]
       [--e2e-interval 10] [--e2e-only | --skip-e2e]
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
from sluice.sinks.iceberg.upsert import pyiceberg_upsert
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


def fingerprint(table: pa.Table) -> list[Any]:
    """Rows, and sums over every column: equal tables give equal fingerprints (a cheap check at 10M rows)."""
    return [
        table.num_rows,
        pc.sum(table.column("id")).as_py(),
        round(pc.sum(table.column("amount")).as_py(), 3),
        pc.sum(pc.utf8_length(table.column("name"))).as_py(),
        pc.sum(table.column("ts")).as_py(),
    ]


def run_format(kind: str, root: Path, args: argparse.Namespace, sets: list[pa.Table]) -> dict[str, Any]:
    work = root / kind
    work.mkdir(parents=True)
    up = Upserts(Target(kind, str(work / "lake"), {}, str(work)))
    built = build(up, args.rows, args.files)
    print(f"{kind}: table of {args.rows:,} rows written in {built:.1f} s", flush=True)
    times, details, prints = [], [], []
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
        prints.append(fingerprint(up.target.read()))
    res: dict[str, Any] = {"commit_s": [round(t, 2) for t in times], "median_s": round(statistics.median(times), 2),
                           "build_s": round(built, 1), "fingerprints": prints}
    if details:
        res["merges"] = details
    return res


def pyiceberg_rounds(root: Path, args: argparse.Namespace, changes: pa.Table) -> dict[str, Any]:
    """sluice's merge and pyiceberg's delete + upsert of the same changes, each into its own copy of one
    table (registered from the same metadata: same files, same snapshot), alternating ``--rounds`` times."""
    from sluice.sinks.iceberg.upsert import IcebergUpsert
    from sluice.sinks.tables.changes import collapse

    work = root / "pyiceberg"
    work.mkdir(parents=True)
    up = Upserts(Target("iceberg", str(work / "lake"), {}, str(work)))
    build(up, args.rows, args.files)
    catalog = up.catalog()
    base = catalog.load_table("db.events").metadata_location
    collapsed = collapse(changes, ["id"])
    times: dict[str, list[float]] = {"sluice": [], "pyiceberg": []}
    for r in range(args.rounds):
        prints = []
        for who in ("sluice", "pyiceberg") if r % 2 == 0 else ("pyiceberg", "sluice"):
            name = f"db.{who}_{r}"
            table = catalog.register_table(name, base)
            t0 = time.perf_counter()
            if who == "sluice":
                engine = IcebergUpsert(lambda _s, name=name: catalog.load_table(name), ("id",), "bench", "sink")
                assert engine.apply(1, collapsed).value == "committed"
            else:
                pyiceberg_upsert(table, collapsed, ["id"], {"sluice.max-committed-checkpoint-id": "1"})
            times[who].append(time.perf_counter() - t0)
            prints.append(fingerprint(catalog.load_table(name).scan().to_arrow()))
            print(f"round {r + 1}: {who} {times[who][-1]:.2f} s", flush=True)
        assert prints[0] == prints[1], f"pyiceberg's upsert gave another table: {prints}"
    return {k: [round(t, 2) for t in v] for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--changes", type=int, default=100_000)
    ap.add_argument("--checkpoints", type=int, default=3)
    ap.add_argument("--files", type=int, default=10)
    ap.add_argument("--hot", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-pyiceberg", action="store_true")
    ap.add_argument("--e2e-events", type=int, default=4_000_000)
    ap.add_argument("--e2e-keys", type=int, default=500_000, help="keys per split")
    ap.add_argument("--e2e-interval", type=float, default=10.0)
    ap.add_argument("--e2e-batch", type=int, default=10_000)
    ap.add_argument("--e2e-only", action="store_true")
    ap.add_argument("--skip-e2e", action="store_true")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="sluice-upserts-bench-"))
    try:
        result: dict[str, Any] = {}
        if not args.skip_e2e:
            e2e = upsert_vs_append(root, args.e2e_events, args.e2e_keys, args.e2e_interval, args.e2e_batch)
            result["e2e"] = e2e
            result["upsert_vs_append"] = min(e2e["delta"]["upsert_vs_append"], e2e["iceberg"]["upsert_vs_append"])
            result.update(e2e_events=args.e2e_events, e2e_keys=args.e2e_keys, e2e_interval=args.e2e_interval)
        if args.e2e_only:
            print("RESULT " + json.dumps(result))
            return
        sets = change_sets(args.rows, args.changes, args.checkpoints, args.hot)
        for kind in ("delta", "iceberg"):
            result[kind] = run_format(kind, root, args, sets)
            shutil.rmtree(root / kind, ignore_errors=True)
        same = result["delta"].pop("fingerprints") == result["iceberg"].pop("fingerprints")
        assert same, "the Delta and the Iceberg table differ after a checkpoint"
        result["delta_merge_s"] = result["delta"]["median_s"]
        result["iceberg_merge_s"] = result["iceberg"]["median_s"]
        if not args.skip_pyiceberg:
            rounds = pyiceberg_rounds(root, args, sets[0])
            result["pyiceberg_rounds"] = rounds
            result["pyiceberg_upsert_s"] = statistics.median(rounds["pyiceberg"])
            ratio = statistics.median(rounds["sluice"]) / statistics.median(rounds["pyiceberg"])
            result["iceberg_vs_pyiceberg_upsert"] = round(ratio, 3)
        result.update(rows=args.rows, changes=args.changes, checkpoints=args.checkpoints, files=args.files, hot=args.hot)
        print("RESULT " + json.dumps(result))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
