"""Kafka -> Parquet with Avro (schema registry) against JSON, in one run; and the decoders alone.

Starts a tansu broker and the recorded schema registry of the tests (tests/connectors/kafka/registry_server.py),
produces ``--messages`` order records twice into 4 partitions -- as JSON text and as Avro in the Confluent
wire format (schema id 1) -- and measures on the same data:

(1) decoders alone, one 10,000-record batch: ``pyarrow.json`` with a schema; sluice's steady JSON decoder
    without a schema; sluice's columnar Avro decoder; fastavro record by record + ``from_pylist`` (the
    path sluice takes for schemas the columnar decoder does not cover, and the usual Python approach);
(2) sluice jobs ``KafkaSource -> FileSink(parquet)`` with exactly-once checkpoints every second, for
    JSON (explicit schema), JSON (inferred, steady) and Avro (registry), at ``--parallelism``.

The last line is ``RESULT {json}``.

Usage: python benchmarks/kafka_formats.py [--messages 1000000] [--parallelism 1]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pyarrow.json as pjson
import pyarrow.parquet as pq
from confluent_kafka import Producer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from kafka_broker import TansuBroker
from sluice.api import Pipeline
from sluice.config import NoRestart
from sluice.connectors.kafka import KafkaSource
from sluice.connectors.kafka.formats.avro import AvroDecoder
from sluice.connectors.kafka.formats.avro_schema import AvroSchema, read_records
from sluice.connectors.kafka.formats.json import JsonDecoder

from tests.connectors.kafka.registry_server import RecordedSchemaRegistry, avro_wire
from tests.connectors.kafka.test_formats_units import ORDER_V1

PARTITIONS = 4
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("customer", pa.string()),
        ("amount", pa.float64()),
        ("status", pa.string()),
        ("placed_at", pa.int64()),
        ("note", pa.string()),
    ]
)


def record(i: int) -> dict[str, Any]:
    return {
        "id": i,
        "customer": f"customer-{i % 100_000:06d}",
        "amount": (i % 1000) + 0.25,
        "status": ("NEW", "PAID", "SHIPPED")[i % 3],
        "placed_at": 1_700_000_000_000 + i,
        "note": None if i % 4 else "gift wrap, please",
    }


def produce(bootstrap: str, topic: str, n: int, encode: Callable[[int], bytes]) -> int:
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
    size = 0
    for i in range(n):
        v = encode(i)
        size += len(v)
        while True:
            try:
                p.produce(topic, v, partition=i % PARTITIONS)
                break
            except BufferError:
                p.poll(0.05)
    if p.flush(300) != 0:
        raise RuntimeError("messages not delivered")
    return size // n


def rate(fn: Callable[[], Any], n: int, repeat: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return n / best


def decoders(json_values: list[bytes], avro_values: list[bytes], registry_url: str) -> dict[str, float]:
    n = len(json_values)
    parse = pjson.ParseOptions(explicit_schema=SCHEMA)
    read = pjson.ReadOptions(block_size=1 << 22)
    avro = AvroSchema(ORDER_V1, 1)
    payloads = [v[5:] for v in avro_values]
    plan_decoder = AvroDecoder(None, avro, None)

    def fastavro_rows() -> pa.RecordBatch:
        parsed = fastavro.parse_schema(ORDER_V1)
        rows = [fastavro.schemaless_reader(io.BytesIO(p), parsed, None) for p in payloads]
        return pa.RecordBatch.from_pylist(rows)

    out = {
        "pyarrow_json_schema": rate(
            lambda: pjson.read_json(io.BytesIO(b"\n".join(json_values)), read_options=read, parse_options=parse), n
        ),
        "sluice_json_steady": rate(lambda: JsonDecoder(None).decode(json_values), n),  # type: ignore[arg-type]
        "sluice_avro_columnar": rate(lambda: plan_decoder.decode(payloads), n),  # type: ignore[arg-type]
        "sluice_avro_fastavro_path": rate(lambda: read_records(payloads, avro, avro), n),
        "fastavro_from_pylist": rate(fastavro_rows, n),
    }
    for name, r in out.items():
        print(f"  decode {name:28s} {r:>12,.0f} rec/s", flush=True)
    return out


def job(bootstrap: str, topic: str, ends: dict[int, int], out: Path, par: int, **options: Any) -> float:
    from sluice.sinks.files import FileSink

    p = Pipeline(
        f"formats-{topic}",
        parallelism=par,
        restart=NoRestart(),
        checkpoint={"interval": 1.0, "storage": str(out / "chk"), "mode": "exactly_once"},
    )
    src = KafkaSource(
        bootstrap, topic, batch_size=10_000, stopping_offsets={(topic, q): o for q, o in ends.items()}, **options
    )
    p.source(src).sink(FileSink(str(out / "parquet"), format="parquet", compression="snappy"))
    t0 = time.perf_counter()
    p.run(runtime="local", restore="none")
    dt = time.perf_counter() - t0
    rows = sum(
        pq.ParquetFile(os.path.join(d, f)).metadata.num_rows
        for d, _, fs in os.walk(out / "parquet")
        for f in fs
        if f.endswith(".parquet")
    )
    total = sum(ends.values())
    if rows != total:
        raise RuntimeError(f"{topic}: committed {rows} rows, expected {total}")
    return total / dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--parallelism", type=int, default=1)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kafka-formats-"))
    result: dict[str, Any] = {"messages": args.messages, "parallelism": args.parallelism}
    try:
        with TansuBroker() as broker, RecordedSchemaRegistry() as registry:
            sid = registry.register("orders-value", ORDER_V1)

            def as_json(i: int) -> bytes:
                return json.dumps(record(i)).encode()

            def as_avro(i: int) -> bytes:
                return avro_wire(sid, ORDER_V1, record(i))

            sample_json = [as_json(i) for i in range(10_000)]
            sample_avro = [as_avro(i) for i in range(10_000)]
            print(
                f"record: {sum(map(len, sample_json)) // 10_000} B as JSON, "
                f"{sum(map(len, sample_avro)) // 10_000} B as Avro",
                flush=True,
            )
            result["decoders_rec_s"] = {k: round(v) for k, v in decoders(sample_json, sample_avro, registry.url).items()}
            for topic, enc in (("orders-json", as_json), ("orders-avro", as_avro)):
                broker.create_topic(topic, PARTITIONS)
                produce(broker.bootstrap, topic, args.messages, enc)
            ends = {t: broker.end_offsets(t, timeout=60) for t in ("orders-json", "orders-avro")}
            runs = {
                "json_schema": ("orders-json", {"format": "json", "schema": SCHEMA}),
                "json_inferred": ("orders-json", {"format": "json"}),
                "avro_registry": ("orders-avro", {"format": "avro", "schema_registry": registry.url}),
            }
            jobs: dict[str, float] = {}
            for name, (topic, options) in runs.items():
                jobs[name] = job(broker.bootstrap, topic, ends[topic], work / name, args.parallelism, **options)
                print(f"  job {name:15s} {jobs[name]:>12,.0f} rec/s", flush=True)
            result["jobs_rec_s"] = {k: round(v) for k, v in jobs.items()}
            result["avro_vs_json"] = round(jobs["avro_registry"] / jobs["json_schema"], 3)
            print(f"Avro (registry) / JSON (schema): {result['avro_vs_json']:.2f}x", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
