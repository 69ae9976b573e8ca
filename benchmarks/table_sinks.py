"""Kafka -> Delta and Kafka -> Iceberg against Kafka -> Parquet (the FileSink), measured in one run.

Starts a tansu broker (tests/kafka_broker.py), produces ``--messages`` JSON messages (~120 bytes, a ``kind``
field with 4 values) into 4 partitions, then runs bounded jobs over the same topic on the local runtime with
exactly-once checkpoints every second at ``--parallelism`` (default 2), every sink partitioned by ``kind``:

(a) baseline ``parquet``: ``FileSink(parquet, bucket_by=["kind"])``;
(b) ``DeltaSink`` and ``IcebergSink``, with the compactor stage (default) and without.

The metric is named before the run (``--metric``: wall time by default; CPU time of the whole process
tree, the broker included, printed beside). The five jobs run in alternated rounds (``--rounds``, at least
3, the order rotated) after an untimed warm-up of each over the first tenth of the topic
(benchmarks/_common.py), each timed from its start to its end (``run()`` returns after the last commit is
visible). Ratios, each the median of the per-round ratios with every round and the spread:
``<kind>_vs_parquet`` (compaction on; target >= 0.8), ``<kind>_no_compaction_vs_parquet`` and
``<kind>_compaction_vs_off`` (target >= 0.85). Every run's output is read back (the Parquet files; the
table through its own library) and compared row by row with the produced messages, never counted from the
sink's metrics. Each table commit's latency (median, p99 over all timed rounds; the global commit runs on
the driver inside the checkpoint's completion) is printed for information.

Then, for each table format, a ``--seconds`` (default 60) unbounded generator job with 1 s checkpoints at
parallelism 2 and compaction on, stopped with a last checkpoint: its table checked against the generator's
rows (each split's first rows, none twice), data files per partition at the end, and after one
background-rewrite round (targets: at most one per checkpoint before, below 10 after; the rewrite must not
change the rows). One run each: a count, not a comparison. Last line: ``RESULT {json}``.

Usage: python benchmarks/table_sinks.py [--quick] [--messages 1000000] [--seconds 60] [--parallelism 2]
       [--rounds 3] [--metric wall|cpu]
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

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from confluent_kafka import Producer

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _checks import check_generator_output  # type: ignore[import-not-found]
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
from sluice.connectors.generator import GeneratorSource
from sluice.connectors.kafka import KafkaSource
from sluice.sinks.files import FileSink
from sluice.sinks.tables import RewritePolicy

from tests.kafka_broker import TansuBroker
from tests.sinks.tables.helpers import Target

SCHEMA = pa.schema([("id", pa.int64()), ("ts", pa.int64()), ("kind", pa.string()), ("amount", pa.float64()), ("payload", pa.string())])
TOPIC = "tables-bench"
PARTITIONS = 4
PAYLOAD = "x" * 30
SIDES = ("parquet", "delta_compaction", "delta_no_compaction", "iceberg_compaction", "iceberg_no_compaction")


def value(i: int) -> bytes:
    return b'{"id": %d, "ts": %d, "kind": "k%d", "amount": %d.5, "payload": "%s"}' % (
        i, 1_700_000_000_000 + i, (i // PARTITIONS) % 4, i % 1000, PAYLOAD.encode(),  # every partition holds every kind
    )  # fmt: skip


def expected_rows(n: int, ends: dict[int, int] | None = None) -> pa.Table:
    """The messages as rows (message ``i`` is offset ``i // 4`` of partition ``i % 4``); with ``ends``, only
    those below each partition's end offset."""
    i = np.arange(n, dtype=np.int64)
    if ends is not None:
        i = i[i // PARTITIONS < np.array([ends[q] for q in range(PARTITIONS)])[i % PARTITIONS]]
    return pa.table({
        "id": i, "ts": 1_700_000_000_000 + i,
        "kind": pa.array(np.char.add("k", ((i // PARTITIONS) % 4).astype(str)).astype(object), pa.string()),
        "amount": (i % 1000) + 0.5, "payload": pa.array(np.full(len(i), PAYLOAD, dtype=object), pa.string()),
    }, schema=SCHEMA)  # fmt: skip


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


def kafka_job(broker: TansuBroker, ends: dict[int, int], sink: Any, work: Path, parallelism: int) -> Timing:
    """The job from its start to its end (``run()`` returns after the last commit is visible)."""
    p = Pipeline("tables-bench", parallelism=parallelism, restart=NoRestart(),
                 checkpoint=CheckpointConfig(interval=1.0, storage=str(work / "chk")))  # fmt: skip
    src = KafkaSource(broker.bootstrap, TOPIC, format="json", schema=SCHEMA, batch_size=10_000,
                      stopping_offsets={(TOPIC, q): off for q, off in ends.items()})  # fmt: skip
    p.source(src).sink(sink)
    with Stopwatch() as sw:
        p.run(runtime="local", restore="none")
    return sw.timing


def check(label: str, got: pa.Table, expected: pa.Table) -> None:
    differs = same_table(got, expected)
    if differs is not None:
        raise RuntimeError(f"{label}: the output differs from the input ({differs})")


def throughput_runs(broker: TansuBroker, n: int, ends: dict[int, int], args: argparse.Namespace, root: Path) -> dict[str, Any]:
    full, warm_ends = expected_rows(n), {q: off // 10 for q, off in ends.items()}
    warm = expected_rows(n, warm_ends)
    latencies: dict[str, list[float]] = {s: [] for s in SIDES}
    files: dict[str, list[int]] = {s: [] for s in SIDES}

    def run(side: str, r: int) -> Timing:
        work = root / f"{side}-{r}"
        stop, expected = (warm_ends, warm) if r == 0 else (ends, full)
        if side == "parquet":
            timing = kafka_job(broker, stop, FileSink(str(work / "out"), bucket_by=["kind"]), work, args.parallelism)
            got = ds.dataset(str(work / "out"), format="parquet", partitioning="hive").to_table()
            check(f"parquet, round {r}", got.set_column(got.schema.get_field_index("kind"), "kind",
                                                        pc.cast(got.column("kind"), pa.string())), expected)  # fmt: skip
        else:
            kind, compaction = side.split("_", 1)
            target = Target(kind, str(work / "lake"), {}, str(work))
            sink = target.sink(partition_by=["kind"], compaction=compaction == "compaction")
            timer = TimedCommits(sink)
            timing = kafka_job(broker, stop, sink, work, args.parallelism)
            check(f"{side}, round {r} (read back)", target.read(), expected)
            if r:
                latencies[side] += timer.latencies
                files[side].append(max(target.files_per_partition().values()))
        shutil.rmtree(work, ignore_errors=True)
        return timing

    timings = alternate(SIDES, args.rounds, run, warmup=not args.no_warmup)
    out: dict[str, Any] = {}
    rate = {s: statistics.median(n / t.wall for t in ts) for s, ts in timings.items()}
    out["parquet_rec_s"] = round(rate["parquet"])
    for kind in ("delta", "iceberg"):
        for compaction in ("compaction", "no_compaction"):
            side = f"{kind}_{compaction}"
            key = f"{kind}_vs_parquet" if compaction == "compaction" else f"{side}_vs_parquet"
            ratios(out, key, timings[side], timings["parquet"], args.metric, ">= 0.8" if compaction == "compaction" else None)
            lat = sorted(latencies[side])
            out[side] = {
                "rec_s": round(rate[side]),
                "ratio_to_parquet": out[key],
                "commits": round(len(lat) / args.rounds, 1),
                "commit_ms_median": round(1000 * statistics.median(lat), 1) if lat else None,
                "commit_ms_p99": round(1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))], 1) if lat else None,
                "files_per_partition_max": max(files[side]) if files[side] else None,
            }
            print(f"{side}: {out[side]}; rounds {', '.join(f'{n / t.wall:,.0f}' for t in timings[side])} rec/s", flush=True)
        ratios(out, f"{kind}_compaction_vs_off", timings[f"{kind}_compaction"], timings[f"{kind}_no_compaction"],
               args.metric, ">= 0.85")  # fmt: skip
    with_runs(out, "timings_wall_cpu", timings)
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
    result = job.stop(savepoint=False)  # a last checkpoint, committed: the table is a prefix of each split
    checkpoints = result.checkpoint_counts.completed
    before = target.files_per_partition()
    table = target.read()
    check_generator_output(table, 2, 100, label=f"{kind} table after {seconds} s")
    if not pc.all(pc.equal(table.column("kind"), pc.cast(pc.bit_wise_and(table.column("key"), 3), pa.string()))).as_py():
        raise RuntimeError(f"{kind}: a row's kind is not its key & 3")
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
    differs = same_table(target.read(), table)
    if differs is not None:
        raise RuntimeError(f"{kind}: the rewrite changed the table's rows ({differs})")
    res = {
        "seconds": seconds,
        "completed_checkpoints": checkpoints,
        "rows": table.num_rows,
        "files_per_partition_before_max": max(before.values()),
        "files_per_partition_after_max": max(after.values()),
        "rewrite_s": round(rewrite_s, 2),
    }
    print(f"files {kind}: {res}", flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="200k messages, 15 s file-count runs")
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--parallelism", type=int, default=2)
    add_round_options(ap)
    args = ap.parse_args()
    if args.quick:
        args.messages, args.seconds = 200_000, 15.0
    check_rounds(args)
    result: dict[str, Any] = {"messages": args.messages, "parallelism": args.parallelism, "metric": args.metric,
                              "rounds": args.rounds, "loadavg_before": load_average()}  # fmt: skip
    root = Path(tempfile.mkdtemp(prefix="sluice-tables-bench-"))
    try:
        with TansuBroker() as broker:
            broker.create_topic(TOPIC, PARTITIONS)
            produce(broker.bootstrap, args.messages)
            ends = broker.end_offsets(TOPIC)
            assert sum(ends.values()) == args.messages, ends
            result.update(throughput_runs(broker, args.messages, ends, args, root))
        for kind in ("delta", "iceberg"):
            result[f"{kind}_files"] = files_run(kind, args.seconds, root)
        result["loadavg_after"] = load_average()
        print("RESULT " + json.dumps(result))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
