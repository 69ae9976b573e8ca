"""Kafka -> Parquet on the in-process runtime vs the Spark runtime (local[2], 1 and 2 slots), in one run.

Starts a tansu broker (tests/kafka_broker.py), produces ``--messages`` ~140-byte JSON messages into 4
partitions, and runs the same exactly-once job (``KafkaSource(format="json")`` -> ``FileSink(parquet)``,
checkpoints every second, bounded by the end offsets) three times: in-process with parallelism 2, then on
one embedded Spark ``local[2,1]`` context with 1 slot and with 2 slots. Every run must commit every record.
Wall time includes each run's start (for Spark: the barrier stage, slot start-up and linking; the context
is created once before, as a long-running driver would).

Without the Kafka connector or the file sink (built concurrently), it falls back to a generator source
and a two-phase Parquet sink defined here.

The last line is ``RESULT {json}`` with records/s per configuration and the ratios vs in-process.

Usage: python benchmarks/spark_runtime.py [--messages 1500000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from sluice.api import Pipeline  # noqa: E402
from sluice.config import NoRestart  # noqa: E402
from sluice.sink import Committer, Sink, SinkContext, SinkWriter  # noqa: E402

TOPIC = "bench"
PARTITIONS = 4
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("ts", pa.int64()),
        ("user", pa.string()),
        ("event", pa.string()),
        ("amount", pa.float64()),
        ("payload", pa.string()),
    ]
)


def value(i: int) -> bytes:
    return (
        b'{"id": %d, "ts": %d, "user": "user-%06d", "event": "click", "amount": %d.25, '
        b'"payload": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}' % (i, 1_700_000_000_000 + i, i % 100_000, i % 1000)
    )


# -- fallback: generator -> two-phase Parquet sink ---------------------------------------------------------
class _ParquetWriter(SinkWriter[str]):
    def __init__(self, directory: str, ctx: SinkContext) -> None:
        self.directory, self.ctx, self.buffer = directory, ctx, []  # type: ignore[var-annotated]

    def write(self, batch: pa.RecordBatch) -> None:
        self.buffer.append(batch)

    def prepare_commit(self, checkpoint_id: int) -> list[str]:
        if not self.buffer:
            return []
        name = f"{self.ctx.job_id}-{checkpoint_id:08d}-{self.ctx.subtask:03d}-a{self.ctx.attempt}.parquet"
        pq.write_table(pa.Table.from_batches(self.buffer), os.path.join(self.directory, ".pending", name))
        self.buffer = []
        return [name]


class _ParquetCommitter(Committer[str]):
    def __init__(self, directory: str) -> None:
        self.directory = directory

    def commit(self, committables: Sequence[str]) -> None:
        for name in committables:
            src = os.path.join(self.directory, ".pending", name)
            if os.path.exists(src):
                os.replace(src, os.path.join(self.directory, name))


class ParquetTwoPhaseSink(Sink[str]):
    """Parquet files: hidden at pre-commit, renamed into place at commit (idempotent)."""

    name = "parquet-2pc"

    def __init__(self, directory: str) -> None:
        self.directory = directory
        os.makedirs(os.path.join(directory, ".pending"), exist_ok=True)

    def create_writer(self, ctx: SinkContext, restored: list[Any]) -> SinkWriter[str]:
        return _ParquetWriter(self.directory, ctx)

    def create_committer(self, ctx: SinkContext) -> Committer[str] | None:
        return _ParquetCommitter(self.directory)


def committed_rows(directory: Path) -> int:
    return sum(
        pq.ParquetFile(os.path.join(d, f)).metadata.num_rows
        for d, dirs, fs in os.walk(directory)
        if "/." not in d and not os.path.basename(d).startswith(".")
        for f in fs
        if f.endswith(".parquet") and not f.startswith(".")
    )


# -- the job -----------------------------------------------------------------------------------------------
def build(out: Path, parallelism: int, source: Callable[[], Any], sink: Callable[[str], Any]) -> Pipeline:
    p = Pipeline(
        f"spark-bench-{out.name}",
        parallelism=parallelism,
        restart=NoRestart(),
        checkpoint={"interval": 1.0, "storage": str(out / "chk")},
    )
    p.source(source()).sink(sink(str(out / "parquet")))
    return p


def timed(p: Pipeline, runtime: str, out: Path, n: int) -> float:
    t0 = time.perf_counter()
    result = p.run(runtime=runtime, restore="none")
    dt = time.perf_counter() - t0
    rows = committed_rows(out / "parquet")
    done = len([c for c in result.checkpoints if c.status == "completed"])
    print(f"  {out.name}: {result.status} in {dt:.1f}s, {done} checkpoints, {rows:,} rows", flush=True)
    if rows != n:
        raise RuntimeError(f"{out.name}: committed {rows} rows, expected {n}")
    return n / dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=1_500_000)
    args = ap.parse_args()
    n = args.messages
    work = Path(tempfile.mkdtemp(prefix="spark-bench-"))
    try:
        from sluice.connectors.kafka import KafkaSource
        from sluice.sinks.files import FileSink

        kafka = True
    except ImportError:
        kafka = False
    from contextlib import ExitStack

    with ExitStack() as stack:
        if kafka:
            sys.path.insert(0, str(ROOT / "tests"))
            from kafka_broker import TansuBroker

            broker = stack.enter_context(TansuBroker())
            broker.create_topic(TOPIC, PARTITIONS)
            _produce(broker.bootstrap, n)
            ends = broker.end_offsets(TOPIC, timeout=60)
            bootstrap = broker.bootstrap

            def source() -> Any:
                return KafkaSource(
                    bootstrap,
                    TOPIC,
                    format="json",
                    schema=SCHEMA,
                    batch_size=10_000,
                    stopping_offsets={(TOPIC, q): off for q, off in ends.items()},
                )

            def sink(d: str) -> Any:
                return FileSink(d, format="parquet", compression="snappy")
        else:
            from sluice.connectors.generator import GeneratorSource

            def source() -> Any:
                return GeneratorSource(num_splits=4, records_per_split=n // 4, batch_size=10_000)

            sink = ParquetTwoPhaseSink  # type: ignore[assignment]
            n = (n // 4) * 4
        print(
            f"source: {'kafka (tansu) -> FileSink' if kafka else 'generator -> parquet 2PC sink'}", flush=True
        )
        rates: dict[str, float] = {}
        rates["in_process_p2"] = timed(
            build(work / "local-p2", 2, source, sink), "local", work / "local-p2", n
        )
        from sluice.runtime.spark import spark_context

        t0 = time.perf_counter()
        spark_context(2)
        print(
            f"  SparkContext local[2,1] started in {time.perf_counter() - t0:.1f}s (not counted)", flush=True
        )
        for slots in (1, 2):
            name = f"spark_local2_{slots}slot"
            rates[name] = timed(build(work / name, slots, source, sink), "spark", work / name, n)
    shutil.rmtree(work, ignore_errors=True)
    base = rates["in_process_p2"]
    print(
        "RESULT "
        + json.dumps(
            {
                "messages": n,
                "source": "kafka" if kafka else "generator",
                "rec_s": {k: round(v) for k, v in rates.items()},
                "ratio_vs_in_process": {k: round(v / base, 3) for k, v in rates.items()},
            }
        )
    )


def _produce(bootstrap: str, n: int) -> None:
    from confluent_kafka import Producer

    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 2_000_000,
            "log_level": 0,
        }
    )
    for i in range(n):
        while True:
            try:
                p.produce(TOPIC, value(i), partition=i % PARTITIONS)
                break
            except BufferError:
                p.poll(0.05)
    if p.flush(300) != 0:
        raise RuntimeError("messages not delivered")


if __name__ == "__main__":
    main()
