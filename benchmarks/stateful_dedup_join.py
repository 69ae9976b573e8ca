"""Deduplication and the enrichment join against the stateless Kafka -> Parquet job, in one run (issue 25).

Starts a tansu broker, produces ``--events`` JSON events into 4 partitions (every ``id`` distinct, ``customer``
one of ``--dims`` keys, ``ts`` increasing) and ``--dims`` dimension rows (one per customer) into a second
topic, then runs on the same data, each job ``KafkaSource(format="json", schema=...) -> FileSink(parquet)``
with exactly-once checkpoints every second:

* ``stateless``: events -> Parquet;
* ``dedup``: events -> ``deduplicate("id", within="1 h", event_time="ts")`` on RocksDB (incremental
  checkpoints) -> Parquet: every id is new, so every record writes a key to state (the Bloom filters spare
  the reads), and the state holds the last 1 h 15 min of ids (4.5M keys) once time buckets expire;
* ``join``: events -> ``join_latest(dims, on="customer", how="left")`` (processing time, the table in
  keyed state on the hashmap backend; ``--join-backend rocksdb`` for RocksDB, ``hashmap-changelog`` for the
  hashmap backend with changelog checkpoints) -> Parquet; the job reads the dimension topic too.

``dedup_vs_stateless`` and ``join_vs_stateless`` are events/s of the stateful job divided by events/s of the
stateless one (targets >= 0.5), by wall time; ``*_cpu`` the same by this process's CPU time (steadier on a
shared machine). Every job's Parquet row count is checked. ``--quick`` runs 1M events and
100k dimension rows instead of 10M and 1M. The last line is ``RESULT {json}``.

Usage: python benchmarks/stateful_dedup_join.py [--quick] [--events N] [--dims N] [--parallelism 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from confluent_kafka import Producer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from kafka_broker import TansuBroker
from sluice.api import Pipeline
from sluice.config import NoRestart
from sluice.connectors.kafka import KafkaSource
from sluice.sinks.files import FileSink

PARTITIONS = 4
T0 = 1_700_000_000_000
EVENTS = pa.schema([("id", pa.int64()), ("customer", pa.int64()), ("amount", pa.float64()), ("ts", pa.int64())])
DIMS = pa.schema([("customer", pa.int64()), ("tier", pa.string()), ("region", pa.string()), ("level", pa.int64())])


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


def parquet_rows(folder: Path) -> int:
    return sum(
        pq.ParquetFile(os.path.join(d, f)).metadata.num_rows
        for d, _, fs in os.walk(folder)
        for f in fs
        if f.endswith(".parquet")
    )


def job(
    kind: str, bootstrap: str, ends: dict[str, dict[int, int]], out: Path, args: argparse.Namespace
) -> tuple[float, float]:
    """Run one job to the end of its input; events per second of wall time and of this process's CPU time
    (every thread of the in-process runtime; the broker is another process)."""
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
    t0, c0 = time.perf_counter(), time.process_time()
    p.run(runtime="local", restore="none")
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    total = sum(ends["events"].values())
    rows = parquet_rows(out / "parquet")
    if rows != total:
        raise RuntimeError(f"{kind}: committed {rows} rows, expected {total}")
    return total / dt, total / cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1M events, 100k dimension rows")
    ap.add_argument("--events", type=int, default=None)
    ap.add_argument("--dims", type=int, default=None)
    ap.add_argument("--parallelism", type=int, default=1)
    ap.add_argument("--join-backend", choices=["hashmap", "hashmap-changelog", "rocksdb"], default="hashmap")
    args = ap.parse_args()
    n_events = args.events or (1_000_000 if args.quick else 10_000_000)
    n_dims = args.dims or (100_000 if args.quick else 1_000_000)
    work = Path(tempfile.mkdtemp(prefix="stateful-dedup-join-"))
    result: dict[str, Any] = {
        "events": n_events, "dims": n_dims, "parallelism": args.parallelism, "quick": args.quick,
        "join_backend": args.join_backend,
    }  # fmt: skip
    try:
        with TansuBroker() as broker:
            broker.create_topic("events", PARTITIONS)
            broker.create_topic("dims", PARTITIONS)
            t0 = time.perf_counter()
            produce(
                broker.bootstrap, "events", n_events,
                lambda i: b'{"id":%d,"customer":%d,"amount":%d.5,"ts":%d}' % (i, (i * 7919) % n_dims, i % 1000, T0 + i),
            )  # fmt: skip
            produce(
                broker.bootstrap, "dims", n_dims,
                lambda i: b'{"customer":%d,"tier":"tier-%d","region":"eu-%d","level":%d}' % (i, i % 5, i % 17, i),
            )  # fmt: skip
            print(f"produced {n_events:,} events, {n_dims:,} dimension rows in {time.perf_counter() - t0:.0f} s", flush=True)
            ends = {t: broker.end_offsets(t, timeout=60) for t in ("events", "dims")}
            rates: dict[str, float] = {}
            cpu: dict[str, float] = {}
            for kind in ("stateless", "dedup", "join"):
                rates[kind], cpu[kind] = job(kind, broker.bootstrap, ends, work / kind, args)
                print(f"  {kind:10s} {rates[kind]:>12,.0f} events/s  {cpu[kind]:>12,.0f} events/CPU-s", flush=True)
                shutil.rmtree(work / kind, ignore_errors=True)
            result["events_per_s"] = {k: round(v) for k, v in rates.items()}
            result["events_per_cpu_s"] = {k: round(v) for k, v in cpu.items()}
            result["dedup_vs_stateless"] = round(rates["dedup"] / rates["stateless"], 3)
            result["join_vs_stateless"] = round(rates["join"] / rates["stateless"], 3)
            result["dedup_vs_stateless_cpu"] = round(cpu["dedup"] / cpu["stateless"], 3)
            result["join_vs_stateless_cpu"] = round(cpu["join"] / cpu["stateless"], 3)
            print(f"dedup_vs_stateless {result['dedup_vs_stateless']:.2f} (target >= 0.5)", flush=True)
            print(f"join_vs_stateless  {result['join_vs_stateless']:.2f} (target >= 0.5)", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
