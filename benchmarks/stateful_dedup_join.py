"""Deduplication and the enrichment join against the stateless Kafka -> Parquet job, in one run (issue 25).

Starts a tansu broker, produces ``--events`` JSON events into 4 partitions (event ``i`` in partition
``i % 4``, ``ts = T0 + i`` ms, ``customer`` one of ``--dims`` keys) and ``--dims`` dimension rows (one per
customer) into a second topic. A quarter of the events repeat the ``id`` of an earlier event of their
partition, at most ~4,000 events (4 s of event time) before it, well within the 1 h horizon (a producer's
retry or an upstream redelivery); the rest carry ids of their own. Then runs on the same data, each job
``KafkaSource(format="json", schema=...) -> FileSink(parquet)`` with exactly-once checkpoints every second:

* ``stateless``: events -> Parquet;
* ``dedup``: events -> ``deduplicate("id", within="1 h", event_time="ts")`` on RocksDB (incremental
  checkpoints) -> Parquet: three quarters of the records are new ids (a key written to state; the Bloom
  filters spare their reads), a quarter are repeats (read from state and dropped);
* ``join``: events -> ``join_latest(dims, on="customer", how="left")`` (processing time, the table in
  keyed state on the hashmap backend; ``--join-backend rocksdb`` for RocksDB, ``hashmap-changelog`` for the
  hashmap backend with changelog checkpoints) -> Parquet; the job reads the dimension topic too.

Every run's Parquet output is compared with a reference computed from the input in NumPy: the stateless
job's rows are the events; the dedup job's the first copy of each id (by partition order, where both copies
of an id are); the join job's the events, each with its customer's dimension row or, if the event came
before that row was read (processing time), nulls: a wrong or partial enrichment fails the run, and the
share of unmatched events is reported.

The three jobs run in alternated rounds (``--rounds``, rotated order) after an untimed warm-up of each over
the first 10% of each partition (benchmarks/_common.py), each timed from its start to its end (its last
commit visible). ``dedup_vs_stateless`` and ``join_vs_stateless`` (targets >= 0.5) are the medians of the
per-round ratios of events per second by the named metric (``--metric``: wall time by default), with the
spread and every round; the same by CPU time of the whole process tree (broker included) beside
(``*_cpu``). ``--quick`` runs 1M events and 100k dimension rows instead of 10M and 1M. The last line is
``RESULT {json}``.

Usage: python benchmarks/stateful_dedup_join.py [--quick] [--events N] [--dims N] [--parallelism 1]
       [--rounds 3] [--metric wall|cpu]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from confluent_kafka import Producer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/kafka_broker.py imports tests.*
from _common import (  # type: ignore[import-not-found]
    Stopwatch,
    Timing,
    add_round_options,
    alternate,
    check_rounds,
    load_average,
    ratios,
    same_table,
    with_runs,
)
from kafka_broker import TansuBroker
from sluice.api import Pipeline
from sluice.config import NoRestart
from sluice.connectors.kafka import KafkaSource
from sluice.sinks.files import FileSink

PARTITIONS = 4
T0 = 1_700_000_000_000
EVENTS = pa.schema([("id", pa.int64()), ("customer", pa.int64()), ("amount", pa.float64()), ("ts", pa.int64())])
DIMS = pa.schema([("customer", pa.int64()), ("tier", pa.string()), ("region", pa.string()), ("level", pa.int64())])
SIDES = ("stateless", "dedup", "join")


def event_table(n: int, dims: int) -> pa.Table:
    """The events, in production order (event ``i`` goes to partition ``i % 4``). Event ``i`` with local
    index ``q = i // 4`` repeats an id when ``q % 4 == 3``: that of event ``i - 4 * (1 + 4k)`` (same
    partition, ``k`` < 250 drawn from ``i``), an event with an id of its own."""
    i = np.arange(n, dtype=np.int64)
    q = i // PARTITIONS
    repeat = q % 4 == 3
    k = np.minimum((i * 7919) % 250, np.maximum(q - 1, 0) // 4)
    ids = np.where(repeat, i - PARTITIONS * (1 + 4 * k), i)
    return pa.table({"id": ids, "customer": (i * 7919) % dims, "amount": (i % 1000) + 0.5, "ts": T0 + i}, schema=EVENTS)


def dim_table(dims: int) -> pa.Table:
    c = np.arange(dims, dtype=np.int64)
    return pa.table(
        {
            "customer": c,
            "tier": pa.array(np.char.add("tier-", (c % 5).astype(str)).astype(object), pa.string()),
            "region": pa.array(np.char.add("eu-", (c % 17).astype(str)).astype(object), pa.string()),
            "level": c,
        },
        schema=DIMS,
    )


def first_copies(events: pa.Table) -> pa.Table:
    """The first event of each id in production order (both copies of an id share a partition, whose order
    the job reads them in): what deduplication with ``keep="first"`` must emit."""
    _, first = np.unique(events.column("id").to_numpy(), return_index=True)
    return events.take(pa.array(np.sort(first)))


def produce(bootstrap: str, topic: str, n: int, encode: Callable[[int], bytes]) -> None:
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 2_000_000,
            "queue.buffering.max.kbytes": 2_097_151,
            "log_level": 0,
        }
    )
    for i in range(n):
        v = encode(i)
        while True:
            try:
                p.produce(topic, v, partition=i % PARTITIONS)
                break
            except BufferError:
                p.poll(0.05)
    if p.flush(600) != 0:
        raise RuntimeError("messages not delivered")


def source(bootstrap: str, topic: str, ends: dict[int, int], schema: pa.Schema, **kw: Any) -> KafkaSource:
    return KafkaSource(
        bootstrap, topic, format="json", schema=schema, batch_size=10_000,
        stopping_offsets={(topic, q): o for q, o in ends.items()}, **kw,
    )  # fmt: skip


def job(kind: str, bootstrap: str, ends: dict[str, dict[int, int]], out: Path, args: argparse.Namespace) -> Timing:
    """Run one job to the end of its input: wall and process-tree CPU time from its start to its end."""
    backend: dict[str, Any] | None = None
    if kind == "dedup":
        backend = {"type": "rocksdb", "incremental": True, "memory": "256 mb"}
    elif kind == "join" and args.join_backend == "rocksdb":
        backend = {"type": "rocksdb", "incremental": True, "memory": "256 mb"}
    elif kind == "join" and args.join_backend == "hashmap-changelog":
        backend = {"type": "hashmap", "changelog": True}
    p = Pipeline(
        f"stateful-{kind}",
        parallelism=args.parallelism,
        restart=NoRestart(),
        checkpoint={"interval": 1.0, "storage": str(out / "chk"), "mode": "exactly_once"},
        state_backend=backend,
    )
    events = p.source(source(bootstrap, "events", ends["events"], EVENTS, event_time="ts"), name="events")
    if kind == "dedup":
        events = events.deduplicate("id", within="1 h", event_time="ts")
    elif kind == "join":
        dims = p.source(source(bootstrap, "dims", ends["dims"], DIMS), name="dims")
        events = events.join_latest(dims, on="customer", how="left")
    events.sink(FileSink(str(out / "parquet"), format="parquet", compression="snappy"))
    with Stopwatch() as sw:
        p.run(runtime="local", restore="none")
    return sw.timing


def check(kind: str, out: Path, events: pa.Table, dims: pa.Table) -> float:
    """Compare a job's Parquet output with the reference; returns the share of unmatched join rows (0 for the
    others). Raises RuntimeError naming what differs."""
    got = ds.dataset(str(out / "parquet"), format="parquet").to_table()
    if kind == "join":
        unmatched = pc.is_null(got.column("tier"))
        facts = got.select(EVENTS.names)
        differs = same_table(facts, events, keys=("ts",))
        if differs is None:  # every matched row carries its customer's dimension row, whole
            matched = got.filter(pc.invert(unmatched)).sort_by("customer")
            want = dims.take(matched.column("customer"))
            bad = [c for c in DIMS.names[1:] if not matched.column(c).equals(want.column(c))]
            nulls = got.filter(unmatched).select(DIMS.names[1:])
            partial = sum(nulls.column(c).null_count != nulls.num_rows for c in DIMS.names[1:])
            differs = f"enrichment columns {bad} differ from the dimension rows" if bad else None
            differs = differs or (f"{partial} enrichment column(s) partly null" if partial else None)
        if differs is not None:
            raise RuntimeError(f"join: {differs}")
        return pc.sum(unmatched).as_py() / max(1, got.num_rows)
    expected = first_copies(events) if kind == "dedup" else events
    differs = same_table(got.select(EVENTS.names), expected, keys=("ts",))
    if differs is not None:
        raise RuntimeError(f"{kind}: the output differs from the reference ({differs})")
    return 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1M events, 100k dimension rows")
    ap.add_argument("--events", type=int, default=None)
    ap.add_argument("--dims", type=int, default=None)
    ap.add_argument("--parallelism", type=int, default=1)
    ap.add_argument("--join-backend", choices=["hashmap", "hashmap-changelog", "rocksdb"], default="hashmap")
    add_round_options(ap)
    args = ap.parse_args()
    check_rounds(args)
    n_events = args.events or (1_000_000 if args.quick else 10_000_000)
    n_dims = args.dims or (100_000 if args.quick else 1_000_000)
    work = Path(tempfile.mkdtemp(prefix="stateful-dedup-join-"))
    result: dict[str, Any] = {
        "events": n_events, "dims": n_dims, "parallelism": args.parallelism, "quick": args.quick,
        "join_backend": args.join_backend, "metric": args.metric, "rounds": args.rounds,
        "loadavg_before": load_average(),
    }  # fmt: skip
    events, dims = event_table(n_events, n_dims), dim_table(n_dims)
    repeats = n_events - len(np.unique(events.column("id").to_numpy()))
    result["duplicate_share"] = round(repeats / n_events, 3)
    try:
        with TansuBroker() as broker:
            broker.create_topic("events", PARTITIONS)
            broker.create_topic("dims", PARTITIONS)
            ids, customers = events.column("id").to_pylist(), events.column("customer").to_pylist()
            produce(
                broker.bootstrap, "events", n_events,
                lambda i: b'{"id":%d,"customer":%d,"amount":%d.5,"ts":%d}' % (ids[i], customers[i], i % 1000, T0 + i),
            )  # fmt: skip
            produce(
                broker.bootstrap, "dims", n_dims,
                lambda i: b'{"customer":%d,"tier":"tier-%d","region":"eu-%d","level":%d}' % (i, i % 5, i % 17, i),
            )  # fmt: skip
            print(f"produced {n_events:,} events ({repeats:,} repeated ids), {n_dims:,} dimension rows", flush=True)
            ends = {t: broker.end_offsets(t, timeout=60) for t in ("events", "dims")}
            warm = {t: {p: max(1, o // 10) for p, o in e.items()} for t, e in ends.items()}
            unmatched: list[float] = []

            def run(kind: str, r: int) -> Timing:
                out = work / f"{kind}-{r}"
                timing = job(kind, broker.bootstrap, ends if r else warm, out, args)
                if r:  # the warm-up reads a tenth of the topics: not compared
                    share = check(kind, out, events, dims)
                    if kind == "join":
                        unmatched.append(round(share, 4))
                shutil.rmtree(out, ignore_errors=True)
                return timing

            timings = alternate(SIDES, args.rounds, run, warmup=not args.no_warmup)
        for kind in ("dedup", "join"):
            ratios(result, f"{kind}_vs_stateless", timings[kind], timings["stateless"], args.metric, ">= 0.5")
        for name, metric in (("events_per_s", "wall"), ("events_per_cpu_s", "cpu")):  # medians over the rounds
            result[name] = {k: round(n_events / statistics.median(t.of(metric) for t in v)) for k, v in timings.items()}
        result["join_unmatched_share"] = unmatched
        with_runs(result, "timings_wall_cpu", timings)
        result["loadavg_after"] = load_average()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
