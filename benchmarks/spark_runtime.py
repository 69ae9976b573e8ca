"""Kafka -> Parquet on the in-process runtime vs the Spark runtime (local[2], 1 and 2 slots), in one run.

Starts a tansu broker (tests/kafka_broker.py), produces ``--messages`` ~140-byte JSON messages into 4
partitions (the same data as ``kafka_ceiling.py``), and runs the same exactly-once job
(``KafkaSource(format="json")`` -> ``FileSink(parquet)``, checkpoints every second, bounded by the end
offsets) three times: in-process with parallelism 2, then on one embedded Spark ``local[2,1]`` context
with 1 slot and with 2 slots. Every run must commit every record. Wall time includes each run's start
(for Spark: the barrier stage, slot start-up and linking; the context is created once before, as a
long-running driver would).

The last line is ``RESULT {json}`` with records/s per configuration and the ratios vs in-process.

Usage: python benchmarks/spark_runtime.py [--messages 1500000]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.dataset as ds
from kafka_ceiling import PARTITIONS, SCHEMA, TOPIC, produce  # type: ignore[import-not-found]

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from kafka_broker import TansuBroker
from sluice.api import Pipeline
from sluice.config import NoRestart
from sluice.connectors.kafka import KafkaSource
from sluice.sinks.files import FileSink


def build(out: Path, parallelism: int, bootstrap: str, ends: dict[int, int]) -> Pipeline:
    p = Pipeline(
        f"spark-bench-{out.name}",
        parallelism=parallelism,
        restart=NoRestart(),
        checkpoint={"interval": 1.0, "storage": str(out / "chk")},
    )
    src = KafkaSource(
        bootstrap,
        TOPIC,
        format="json",
        schema=SCHEMA,
        batch_size=10_000,
        stopping_offsets={(TOPIC, q): off for q, off in ends.items()},
    )
    p.source(src).sink(FileSink(str(out / "parquet"), format="parquet", compression="snappy"))
    return p


def timed(p: Pipeline, runtime: str, out: Path, n: int) -> float:
    t0 = time.perf_counter()
    result = p.run(runtime=runtime, restore="none")  # type: ignore[arg-type]
    dt = time.perf_counter() - t0
    rows = ds.dataset(str(out / "parquet"), format="parquet").count_rows()
    done = len([c for c in result.checkpoints if c.status == "completed"])
    print(f"  {out.name}: {result.status} in {dt:.1f}s, {done} checkpoints, {rows:,} rows", flush=True)
    if rows != n:
        raise RuntimeError(f"{out.name}: committed {rows} rows, expected {n}")
    return n / dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=1_500_000)
    n = ap.parse_args().messages
    work = Path(tempfile.mkdtemp(prefix="spark-bench-"))
    rates: dict[str, float] = {}
    with TansuBroker() as broker:
        broker.create_topic(TOPIC, PARTITIONS)
        produce(broker.bootstrap, n)
        ends = broker.end_offsets(TOPIC, timeout=60)
        rates["in_process_p2"] = timed(
            build(work / "local-p2", 2, broker.bootstrap, ends), "local", work / "local-p2", n
        )
        from sluice.runtime.spark import spark_context

        t0 = time.perf_counter()
        spark_context(2)
        print(
            f"  SparkContext local[2,1] started in {time.perf_counter() - t0:.1f}s (not counted)", flush=True
        )
        for slots in (1, 2):
            name = f"spark_local2_{slots}slot"
            rates[name] = timed(build(work / name, slots, broker.bootstrap, ends), "spark", work / name, n)
    shutil.rmtree(work, ignore_errors=True)
    base = rates["in_process_p2"]
    print(
        "RESULT "
        + json.dumps(
            {
                "messages": n,
                "source": "kafka",
                "rec_s": {k: round(v) for k, v in rates.items()},
                "ratio_vs_in_process": {k: round(v / base, 3) for k, v in rates.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
