"""Kafka -> Kafka (exactly once) and Kafka -> PostgreSQL against Kafka -> Parquet (the FileSink), in one run.

Starts a tansu broker (tests/kafka_broker.py) and a PostgreSQL server from Debian's package
(tests/postgres_server.py), produces ``--messages`` JSON messages (~120 bytes) into 4 partitions, then runs
bounded jobs over the same topic on the local runtime with exactly-once checkpoints every second at
``--parallelism`` (default 2):

(a) baseline: ``FileSink(parquet)``, run first and last (ratios use the mean of both);
(b) ``kafka_sink_vs_file``: ``KafkaSink(delivery="exactly_once")`` into a 4-partition topic, JSON values
    keyed by ``id`` (target >= 0.5x the baseline);
(c) ``postgres_vs_file``: ``PostgresSink(mode="append")`` (``COPY``; target >= 0.3x), and
    ``mode="upsert"`` by ``id`` (recorded).

Each job's output is checked (records published, rows in the table) and the commits' mean time is taken
from the job's metrics (a Kafka transaction per writer subtask and checkpoint; ``COMMIT PREPARED``, and for
upserts the merge). Last line: ``RESULT {json}``.

Usage: python benchmarks/sinks.py [--messages 1000000] [--parallelism 2]
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

import pyarrow as pa
import pyarrow.dataset as ds
from confluent_kafka import Producer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
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


def value(i: int) -> bytes:
    return b'{"id": %d, "ts": %d, "kind": "k%d", "amount": %d.5, "payload": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}' % (
        i, 1_700_000_000_000 + i, i % 4, i % 1000,
    )  # fmt: skip


def produce(bootstrap: str, n: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10_000,
                  "queue.buffering.max.messages": 2_000_000, "log_level": 0})  # fmt: skip
    for i in range(n):
        while True:
            try:
                p.produce(TOPIC, value(i), partition=i % PARTITIONS)
                break
            except BufferError:
                p.poll(0.05)
    if p.flush(300) != 0:
        raise RuntimeError("messages not delivered")


def kafka_job(broker: TansuBroker, name: str, ends: dict[int, int], sink: Any, work: Path, parallelism: int) -> tuple[float, Any]:
    p = Pipeline(name, parallelism=parallelism, restart=NoRestart(),
                 checkpoint=CheckpointConfig(interval=1.0, storage=str(work / "chk")))  # fmt: skip
    src = KafkaSource(broker.bootstrap, TOPIC, format="json", schema=SCHEMA, batch_size=10_000,
                      stopping_offsets={(TOPIC, q): off for q, off in ends.items()})  # fmt: skip
    p.source(src).sink(sink)
    t0 = time.perf_counter()
    result = p.run(runtime="local", restore="none")
    return time.perf_counter() - t0, result


def commit_stats(result: Any) -> dict[str, Any]:
    m = result.metrics
    commits = int(m.get("commits", 0))
    return {
        "checkpoints": result.checkpoint_counts.completed,
        "commits": commits,
        "commit_ms_mean": round(m.get("commit_time_us", 0) / commits / 1000, 1) if commits else None,
    }


def parquet_run(broker: TansuBroker, ends: dict[int, int], work: Path, n: int, par: int, out: dict[str, Any]) -> float:
    """The baseline: the same job into Parquet files; returns records per second."""
    secs, result = kafka_job(broker, f"bench-{work.name}", ends, FileSink(str(work / "out")), work, par)
    rows = ds.dataset(str(work / "out"), format="parquet").count_rows()
    assert rows == n, f"the file sink committed {rows} of {n} rows"
    out[work.name] = {"rec_s": round(n / secs), "seconds": round(secs, 1), **commit_stats(result)}
    print(f"{work.name}: {out[work.name]}", flush=True)
    return n / secs


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--parallelism", type=int, default=2)
    args = ap.parse_args()
    n, par = args.messages, args.parallelism
    root = Path(tempfile.mkdtemp(prefix="sluice-sinks-bench-"))
    out: dict[str, Any] = {"messages": n, "parallelism": par}
    try:
        with TansuBroker() as broker, PostgresServer() as pg:
            broker.create_topic(TOPIC, PARTITIONS)
            produce(broker.bootstrap, n)
            ends = broker.end_offsets(TOPIC)
            assert sum(ends.values()) == n, ends

            base = parquet_run(broker, ends, root / "parquet-1", n, par, out)

            broker.create_topic("sinks-bench-out", PARTITIONS)
            work = root / "kafka"
            sink = KafkaSink(broker.bootstrap, "sinks-bench-out", key_columns="id", key_format="json")
            secs, result = kafka_job(broker, "bench-kafka", ends, sink, work, par)
            published = int(result.metrics.get("kafka_published_records", 0))
            assert published == n, f"the Kafka sink published {published} of {n} records"
            out["kafka_sink_vs_file"] = round(n / secs / base, 3)
            out["kafka"] = {"rec_s": round(n / secs), "seconds": round(secs, 1), **commit_stats(result),
                            "transactions": int(result.metrics.get("kafka_transactions", 0))}  # fmt: skip
            print(f"kafka exactly_once: {out['kafka']} ratio {out['kafka_sink_vs_file']}", flush=True)

            for mode in ("append", "upsert"):
                db = pg.new_database()
                work = root / f"pg-{mode}"
                keys = {"key_columns": ["id"]} if mode == "upsert" else {}
                secs, result = kafka_job(broker, f"bench-pg-{mode}", ends, PostgresSink(db, "events", mode=mode, **keys),
                                         work, par)  # fmt: skip
                (count,) = pg.query("SELECT count(*) FROM events", conninfo=db)[0]
                assert count == n, f"the PostgreSQL sink ({mode}) committed {count} of {n} rows"
                key = "postgres_vs_file" if mode == "append" else "postgres_upsert_vs_file"
                out[key] = round(n / secs / base, 3)
                out[f"postgres_{mode}"] = {"rec_s": round(n / secs), "seconds": round(secs, 1), **commit_stats(result)}
                print(f"postgres {mode}: {out[f'postgres_{mode}']} ratio {out[key]}", flush=True)
            # the baseline again, last: the ratios use the mean of both runs (the first one also warms up)
            base = (base + parquet_run(broker, ends, root / "parquet-2", n, par, out)) / 2
            for key, what in (("kafka_sink_vs_file", "kafka"), ("postgres_vs_file", "postgres_append"),
                              ("postgres_upsert_vs_file", "postgres_upsert")):  # fmt: skip
                out[key] = round(out[what]["rec_s"] / base, 3)
            out["parquet_rec_s_mean"] = round(base)
        print("RESULT " + json.dumps(out))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
