"""Kafka -> Kafka (exactly once) and Kafka -> PostgreSQL against Kafka -> Parquet (the FileSink), in one run.

Starts a tansu broker (tests/kafka_broker.py) and a PostgreSQL server from Debian's package
(tests/postgres_server.py), produces ``--messages`` JSON messages (~120 bytes) into 4 partitions, message
``i`` with ``id = i % (messages / 2)`` (every id twice, both in one partition, the second half of the topic
changing the first half's ids) and ``ts = T0 + i`` (unique), then runs bounded jobs over the same topic on
the local runtime with exactly-once checkpoints every second at ``--parallelism`` (default 2):

(a) baseline: ``FileSink(parquet)``;
(b) ``kafka_sink_vs_file``: ``KafkaSink(delivery="exactly_once")`` into a 4-partition topic, JSON values
    keyed by ``id`` (target >= 0.5x the baseline);
(c) ``postgres_vs_file``: ``PostgresSink(mode="append")`` (``COPY``; target >= 0.3x), and
    ``postgres_upsert_vs_file``: ``mode="upsert"`` by ``id`` (recorded; half the messages update a row an
    earlier checkpoint wrote, unless both copies of an id fall in one checkpoint).

The four jobs run in alternated rounds (``--rounds``, rotated order, an untimed warm-up of each first;
benchmarks/_common.py), each timed from its start to its end (its last commit visible). Each ratio is the
median of the per-round ratios by the named metric (``--metric``: wall time by default; CPU time of the
whole process tree, broker and database server included, beside), with every round and the spread. Every
run's output is compared with the input, never with the sink's own counters: the Parquet files read back;
the output topic read back by a plain ``read_committed`` consumer (every value decoded and compared); the
append table's rows; the upsert table's rows against the last message of each id, and how many rows the
server counted as updated (``pg_stat_user_tables.n_tup_upd``). Commit times (the job's ``commit_time_us``)
are printed for information. Last line: ``RESULT {json}``.

Usage: python benchmarks/sinks.py [--quick] [--messages 1000000] [--parallelism 2] [--rounds 3] [--metric wall|cpu]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.dataset as ds
import pyarrow.json as pajson
from confluent_kafka import Producer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
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
from sluice import CheckpointConfig, NoRestart, Pipeline
from sluice.connectors.kafka import KafkaSource
from sluice.sinks.files import FileSink
from sluice.sinks.kafka import KafkaSink
from sluice.sinks.postgres import PostgresSink

from tests.kafka_broker import TansuBroker
from tests.postgres_server import PostgresServer

SCHEMA = pa.schema([("id", pa.int64()), ("ts", pa.int64()), ("kind", pa.string()), ("amount", pa.float64()),
                    ("payload", pa.string())])  # fmt: skip
TOPIC = "sinks-bench"
PARTITIONS = 4
T0 = 1_700_000_000_000
PAYLOAD = "x" * 30
SIDES = ("parquet", "kafka", "postgres_append", "postgres_upsert")


def distinct_ids(n: int) -> int:
    """Ids of an ``n``-message topic: half of ``n``, rounded to the partitions so both copies of an id
    share one (their order is then the partition's)."""
    return max(PARTITIONS, n // 2 // PARTITIONS * PARTITIONS)


def value(i: int, ids: int) -> bytes:
    return b'{"id": %d, "ts": %d, "kind": "k%d", "amount": %d.5, "payload": "%s"}' % (
        i % ids, T0 + i, i % 4, i % 1000, PAYLOAD.encode(),
    )  # fmt: skip


def expected_rows(n: int) -> pa.Table:
    """Every message of the topic as a row, in ``ts`` order (what an append must hold)."""
    i = np.arange(n, dtype=np.int64)
    return pa.table(
        {
            "id": i % distinct_ids(n),
            "ts": T0 + i,
            "kind": pa.array(np.char.add("k", (i % 4).astype(str)).astype(object), pa.string()),
            "amount": (i % 1000) + 0.5,
            "payload": pa.array(np.full(n, PAYLOAD, dtype=object), pa.string()),
        },
        schema=SCHEMA,
    )


def expected_upsert(n: int) -> pa.Table:
    """The last message of each id (the largest ``ts``): what the upsert table must hold."""
    rows = expected_rows(n)
    return rows.slice(n - distinct_ids(n)) if n >= 2 * distinct_ids(n) else rows  # the last copy of each id


def produce(bootstrap: str, n: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10_000,
                  "queue.buffering.max.messages": 2_000_000, "log_level": 0})  # fmt: skip
    ids = distinct_ids(n)
    for i in range(n):
        while True:
            try:
                p.produce(TOPIC, value(i, ids), partition=i % PARTITIONS)
                break
            except BufferError:
                p.poll(0.05)
    if p.flush(300) != 0:
        raise RuntimeError("messages not delivered")


def kafka_job(broker: TansuBroker, name: str, ends: dict[int, int], sink: Any, work: Path, parallelism: int) -> tuple[Timing, Any]:
    """The job from its start to its end (``run()`` returns after the last commit is visible)."""
    p = Pipeline(name, parallelism=parallelism, restart=NoRestart(),
                 checkpoint=CheckpointConfig(interval=1.0, storage=str(work / "chk")))  # fmt: skip
    src = KafkaSource(broker.bootstrap, TOPIC, format="json", schema=SCHEMA, batch_size=10_000,
                      stopping_offsets={(TOPIC, q): off for q, off in ends.items()})  # fmt: skip
    p.source(src).sink(sink)
    with Stopwatch() as sw:
        result = p.run(runtime="local", restore="none")
    return sw.timing, result


def commit_stats(result: Any) -> dict[str, Any]:
    """The job's own commit figures: for information only (the output is checked by reading it)."""
    m = result.metrics
    commits = int(m.get("commits", 0))
    return {
        "checkpoints": result.checkpoint_counts.completed,
        "commits": commits,
        "commit_ms_mean": round(m.get("commit_time_us", 0) / commits / 1000, 1) if commits else None,
    }


def check(label: str, got: pa.Table, expected: pa.Table) -> None:
    differs = same_table(got, expected, keys=("ts",))
    if differs is not None:
        raise RuntimeError(f"{label}: the output differs from the input ({differs})")


def read_topic(broker: TansuBroker, topic: str) -> pa.Table:
    """The output topic as a plain ``read_committed`` consumer reads it (every partition to its last stable
    offset), each value decoded."""
    records = broker.read_committed(topic, timeout=300)
    if not records:
        return SCHEMA.empty_table()
    return pajson.read_json(pa.py_buffer(b"\n".join(r.value or b"null" for r in records)),
                            parse_options=pajson.ParseOptions(explicit_schema=SCHEMA))  # fmt: skip


def read_table(pg: PostgresServer, db: str, upsert: bool) -> tuple[pa.Table, int]:
    """Every row of table ``events`` (by ``COPY ... TO STDOUT``), and (``upsert``) the rows the server
    counted as updated."""
    import psycopg

    cols = ", ".join(SCHEMA.names)
    with psycopg.connect(db, autocommit=True) as conn, conn.cursor() as cur:
        data = bytearray()
        with cur.copy(f"COPY (SELECT {cols} FROM events) TO STDOUT (FORMAT csv)") as copy:
            for chunk in copy:
                data += chunk
        # the sink's sessions report their counts when they end or idle (within seconds): wait for them
        updated, deadline = 0, time.monotonic() + 30
        while upsert and time.monotonic() < deadline:
            row = cur.execute("SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = 'events'").fetchone()
            updated = int(row[0]) if row else 0
            if updated:
                break
            time.sleep(0.5)
    options = pacsv.ReadOptions(column_names=SCHEMA.names)
    table = pacsv.read_csv(pa.py_buffer(bytes(data)), read_options=options,
                           convert_options=pacsv.ConvertOptions(column_types=SCHEMA))  # fmt: skip
    return table, updated


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="100k messages")
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--parallelism", type=int, default=2)
    add_round_options(ap)
    args = ap.parse_args()
    if args.quick:
        args.messages = 100_000
    check_rounds(args)
    n, par = args.messages, args.parallelism
    root = Path(tempfile.mkdtemp(prefix="sluice-sinks-bench-"))
    out: dict[str, Any] = {"messages": n, "distinct_ids": distinct_ids(n), "parallelism": par, "metric": args.metric,
                           "rounds": args.rounds, "loadavg_before": load_average()}  # fmt: skip
    rows, last = expected_rows(n), expected_upsert(n)
    jobs: dict[str, list[dict[str, Any]]] = {s: [] for s in SIDES}
    try:
        with TansuBroker() as broker, PostgresServer() as pg:
            broker.create_topic(TOPIC, PARTITIONS)
            produce(broker.bootstrap, n)
            ends = broker.end_offsets(TOPIC)
            assert sum(ends.values()) == n, ends

            def run(side: str, r: int) -> Timing:
                work = root / f"{side}-{r}"
                figures: dict[str, Any] = {}
                if side == "parquet":
                    timing, result = kafka_job(broker, f"bench-parquet-{r}", ends, FileSink(str(work / "out")), work, par)
                    check(f"parquet, round {r}", ds.dataset(str(work / "out"), format="parquet").to_table(), rows)
                elif side == "kafka":
                    topic = f"sinks-bench-out-{r}"
                    broker.create_topic(topic, PARTITIONS)
                    sink = KafkaSink(broker.bootstrap, topic, key_columns="id", key_format="json")
                    timing, result = kafka_job(broker, f"bench-kafka-{r}", ends, sink, work, par)
                    check(f"kafka, round {r} (read back read_committed)", read_topic(broker, topic), rows)
                    figures["transactions"] = int(result.metrics.get("kafka_transactions", 0))
                else:
                    mode = side.removeprefix("postgres_")
                    db = pg.new_database()
                    keys = {"key_columns": ["id"]} if mode == "upsert" else {}
                    sink = PostgresSink(db, "events", mode=mode, **keys)
                    timing, result = kafka_job(broker, f"bench-pg-{mode}-{r}", ends, sink, work, par)
                    table, updated = read_table(pg, db, mode == "upsert")
                    check(f"postgres {mode}, round {r}", table, last if mode == "upsert" else rows)
                    figures["rows_updated"] = updated
                    if mode == "upsert" and updated == 0:
                        raise RuntimeError(f"postgres upsert, round {r}: no row was updated (every id's copies "
                                           "fell in one checkpoint: make the run longer)")  # fmt: skip
                shutil.rmtree(work, ignore_errors=True)
                if r:
                    jobs[side].append({"rec_s": round(n / timing.wall), **commit_stats(result), **figures})
                return timing

            timings = alternate(SIDES, args.rounds, run, warmup=not args.no_warmup)
        for key, side, target in (("kafka_sink_vs_file", "kafka", ">= 0.5"), ("postgres_vs_file", "postgres_append", ">= 0.3"),
                                  ("postgres_upsert_vs_file", "postgres_upsert", None)):  # fmt: skip
            ratios(out, key, timings[side], timings["parquet"], args.metric, target)
        out["jobs"] = jobs
        with_runs(out, "timings_wall_cpu", timings)
        out["loadavg_after"] = load_average()
        print("RESULT " + json.dumps(out))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
