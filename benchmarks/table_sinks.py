"""Kafka -> Delta and Kafka -> Iceberg against Kafka -> Parquet (the FileSink), measured in one run.

Starts a tansu broker (tests/kafka_broker.py), produces ``--messages`` JSON messages (~120 bytes, a ``kind``
field with 4 values) into 4 partitions, then runs bounded jobs over the same topic on the local runtime with
exactly-once checkpoints every second at ``--parallelism`` (default 2), every sink partitioned by ``kind``:

(a) baseline: ``FileSink(parquet, bucket_by=["kind"])``;
(b) ``DeltaSink`` and ``IcebergSink``, with the compactor stage (default) and without.

It reports throughput and its ratio to the baseline (target >= 0.8x), compaction on vs off (target >=
0.85x), and each table commit's latency (median, p99; the global commit runs on the driver inside the
checkpoint's completion). Then, for each table format, a ``--seconds`` (default 60) unbounded generator job
with 1 s checkpoints at parallelism 2 and compaction on: data files per partition at the end, and after one
background-rewrite round (targets: at most one per checkpoint before, below 10 after). Last line:
``RESULT {json}``.

Usage: python benchmarks/table_sinks.py [--messages 1000000] [--seconds 60] [--parallelism 2]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from confluent_kafka import Producer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from sluice import CheckpointConfig, NoRestart, Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.connectors.kafka import KafkaSource
from sluice.sinks.files import FileSink
from sluice.sinks.tables import RewritePolicy

from tests.kafka_broker import TansuBroker
from tests.sinks.tables.helpers import Target

SCHEMA = pa.schema([("id", pa.int64()), ("ts", pa.int64()), ("kind", pa.string()), ("amount", pa.float64()), ("payload", pa.string())])
TOPIC = "tables-bench"
PARTITIONS = 4


def value(i: int) -> bytes:
    return b'{"id": %d, "ts": %d, "kind": "k%d", "amount": %d.5, "payload": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}' % (
        i, 1_700_000_000_000 + i, (i // PARTITIONS) % 4, i % 1000,  # every Kafka partition holds every kind
    )


def produce(bootstrap: str, n: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10_000,
                  "queue.buffering.max.messages": 2_000_000, "log_level": 0})
    for i in range(n):
        while True:
            try:
                p.produce(TOPIC, value(i), partition=i % PARTITIONS)
                break
            except BufferError:
                p.poll(0.05)
    if p.flush(300) != 0:
        raise RuntimeError("messages not delivered")


class TimedCommits:
    """Wraps a sink's global committer to time every commit (benchmark only)."""

    def __init__(self, sink: Any) -> None:
        self.latencies: list[float] = []
        create = sink.create_global_committer

        def timed(ctx: Any) -> Any:
            gc = create(ctx)
            commit = gc.commit

            def run(checkpoint_id: int, committables: Any) -> Any:
                t0 = time.perf_counter()
                out = commit(checkpoint_id, committables)
                if committables:
                    self.latencies.append(time.perf_counter() - t0)
                return out

            gc.commit = run
            return gc

        sink.create_global_committer = timed


def kafka_job(broker: TansuBroker, n: int, ends: dict[int, int], sink: Any, work: Path, parallelism: int) -> float:
    p = Pipeline("tables-bench", parallelism=parallelism, restart=NoRestart(),
                 checkpoint=CheckpointConfig(interval=1.0, storage=str(work / "chk")))
    src = KafkaSource(broker.bootstrap, TOPIC, format="json", schema=SCHEMA, batch_size=10_000,
                      stopping_offsets={(TOPIC, q): off for q, off in ends.items()})
    p.source(src).sink(sink)
    t0 = time.perf_counter()
    p.run(runtime="local", restore="none")
    return n / (time.perf_counter() - t0)


def throughput_runs(broker: TansuBroker, n: int, ends: dict[int, int], parallelism: int, root: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    work = root / "parquet"
    rate = kafka_job(broker, n, ends, FileSink(str(work / "out"), bucket_by=["kind"]), work, parallelism)
    rows = ds.dataset(str(work / "out"), format="parquet", partitioning="hive").count_rows()
    assert rows == n, f"the file sink committed {rows} of {n} rows"
    out["parquet_rec_s"] = round(rate)
    print(f"parquet file sink: {rate:,.0f} rec/s", flush=True)
    for kind in ("delta", "iceberg"):
        for compaction in (True, False):
            work = root / f"{kind}-{compaction}"
            target = Target(kind, str(work / "lake"), {}, str(work))
            sink = target.sink(partition_by=["kind"], compaction=compaction)
            timer = TimedCommits(sink)
            rate = kafka_job(broker, n, ends, sink, work, parallelism)
            rows = target.read().num_rows
            assert rows == n, f"{kind} committed {rows} of {n} rows"
            lat = sorted(timer.latencies)
            key = f"{kind}_{'compaction' if compaction else 'no_compaction'}"
            out[key] = {
                "rec_s": round(rate),
                "ratio_to_parquet": round(rate / out["parquet_rec_s"], 3),
                "commits": len(lat),
                "commit_ms_median": round(1000 * statistics.median(lat), 1) if lat else None,
                "commit_ms_p99": round(1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))], 1) if lat else None,
                "files_per_partition_max": max(target.files_per_partition().values()),
            }
            print(f"{key}: {out[key]}", flush=True)
        on, off = out[f"{kind}_compaction"]["rec_s"], out[f"{kind}_no_compaction"]["rec_s"]
        out[f"{kind}_compaction_vs_off"] = round(on / off, 3)
    return out


def files_run(kind: str, seconds: float, root: Path) -> dict[str, Any]:
    work = root / f"files-{kind}"
    target = Target(kind, str(work / "lake"), {}, str(work))
    p = Pipeline(f"files-{kind}", parallelism=2, checkpoint=CheckpointConfig(interval=1.0, storage=str(work / "chk")))
    src = GeneratorSource(num_splits=2, records_per_split=None, batch_size=500, rows_per_second=20_000)
    kinds = lambda b: b.append_column("kind", pc.cast(pc.bit_wise_and(b.column("key"), 3), pa.string()))  # noqa: E731
    sink = target.sink(partition_by=["kind"])
    p.source(src).map_batches(kinds).sink(sink)
    job = p.start(runtime="local", restore="none")
    time.sleep(seconds)
    result = job.cancel()
    checkpoints = result.checkpoint_counts.completed
    before = target.files_per_partition()
    rows = target.read().num_rows
    policy = RewritePolicy(every=1, min_files=2, target_size=128 * 1024 * 1024)
    t0 = time.perf_counter()
    if kind == "delta":
        from sluice.sinks.delta.rewrite import rewrite_small_files

        rewrite_small_files(sink.options, policy)  # type: ignore[attr-defined]
    else:
        from sluice.sinks.iceberg.rewrite import rewrite_small_files as iceberg_rewrite

        iceberg_rewrite(sink.options, policy, threading.Lock())  # type: ignore[attr-defined]
    rewrite_s = time.perf_counter() - t0
    after = target.files_per_partition()
    assert target.read().num_rows == rows, "the rewrite changed the table's rows"
    res = {
        "seconds": seconds,
        "completed_checkpoints": checkpoints,
        "rows": rows,
        "files_per_partition_before_max": max(before.values()),
        "files_per_partition_after_max": max(after.values()),
        "rewrite_s": round(rewrite_s, 2),
    }
    print(f"files {kind}: {res}", flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--parallelism", type=int, default=2)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="sluice-tables-bench-"))
    try:
        with TansuBroker() as broker:
            broker.create_topic(TOPIC, PARTITIONS)
            produce(broker.bootstrap, args.messages)
            ends = broker.end_offsets(TOPIC)
            assert sum(ends.values()) == args.messages, ends
            result = throughput_runs(broker, args.messages, ends, args.parallelism, root)
        for kind in ("delta", "iceberg"):
            result[f"{kind}_files"] = files_run(kind, args.seconds, root)
        result["messages"] = args.messages
        result["parallelism"] = args.parallelism
        print("RESULT " + json.dumps(result))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
