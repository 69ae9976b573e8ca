"""The schema registry's wire format decoded natively against in Python: Avro and JSON Schema.

Starts a tansu broker and the recorded schema registry of the tests (tests/connectors/kafka/registry_server.py),
produces ``--messages`` records into 4 partitions twice -- Avro (schema id 1, the tests' order record) and
JSON Schema (schema id 4, the tests' event record) in the Confluent wire format -- and measures on the
same data:

(1) decoding alone, the values in batches of 10,000: the native decoder (``_native.WireDecoder``, what the
    native reader runs with the GIL released) against sluice's Python decoder (``AvroDecoder``: columnar
    numpy + fastavro; ``JsonSchemaDecoder``: ``pyarrow.json``), both checked to give identical batches;
(2) sluice jobs ``KafkaSource -> FileSink(parquet)`` at parallelism 1 with ``reader="native"`` against
    ``reader="python"``, rounds alternated; each output's row count and id sum checked against the input.

Metric, named in advance: records/s by wall time (median of ``--rounds``, every round printed; CPU time
beside: the process's, pyarrow.json's thread pool included). The last line is ``RESULT {json}``.

Usage: python benchmarks/wire_decode.py [--messages 200000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from kafka_broker import TansuBroker
from sluice.api import Pipeline
from sluice.config import NoRestart
from sluice.connectors.kafka import KafkaSource, _native
from sluice.connectors.kafka.formats import make_decoder
from sluice.connectors.kafka.native_reader import as_decoded
from sluice.connectors.kafka.native_wire import WireTable

from benchmarks.kafka_formats import PARTITIONS, produce
from tests.connectors.kafka.registry_server import RecordedSchemaRegistry, avro_wire, json_wire
from tests.connectors.kafka.test_formats_units import EVENT_V1, ORDER_V1, source

BATCH = 10_000


def order(i: int) -> dict[str, Any]:
    return {
        "id": i,
        "customer": f"customer-{i % 100_000:06d}",
        "amount": (i % 1000) + 0.25,
        "status": ("NEW", "PAID", "SHIPPED")[i % 3],
        "placed_at": 1_700_000_000_000 + i,
        "note": None if i % 4 else "gift wrap, please",
    }


def event(i: int) -> dict[str, Any]:
    return {"id": i, "kind": ("click", "view", "buy")[i % 3], "score": i % 97, "tags": ["a", f"t{i % 10}"]}


def decoding(fmt: str, registry_url: str, values: list[bytes], rounds: int) -> dict[str, Any]:
    """Records/s of the native and the Python decoder over ``values`` (batches of BATCH), alternated."""
    py = make_decoder(source(format=fmt, schema_registry=registry_url))
    native = _native.WireDecoder(True)
    table = WireTable(py, native.configure)
    py.decode(values[:BATCH])  # type: ignore[attr-defined]  # learns the id, as the reader's first batch
    table.update()
    assert table.refused == {}, table.refused
    batches = [values[i : i + BATCH] for i in range(0, len(values), BATCH)]
    arrays = [pa.array(b, pa.binary()) for b in batches]
    for n, (b, a) in enumerate(zip(batches, arrays, strict=True)):  # every batch, once, outside the timed rounds
        by_py, by_native = py.decode(b), as_decoded(native.decode(a))  # type: ignore[attr-defined]
        if by_py.batch is None or by_native.batch is None or not by_py.batch.equals(by_native.batch):
            raise RuntimeError(f"decode {fmt}: batch {n}: the native decoder's rows differ from the Python decoder's")

    def run_native() -> None:
        for a in arrays:
            assert native.decode(a) is not None

    def run_python() -> None:
        for b in batches:
            py.decode(b)  # type: ignore[attr-defined]

    out: dict[str, list[float]] = {"native": [], "python": []}
    cpu: dict[str, list[float]] = {"native": [], "python": []}
    for r in range(rounds):
        for name, fn in (("native", run_native), ("python", run_python))[:: 1 if r % 2 == 0 else -1]:  # alternated
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            out[name].append(len(values) / (time.perf_counter() - t0))
            cpu[name].append(len(values) / (time.process_time() - c0))  # pyarrow.json parses on its pool
    res = summary(f"decode {fmt}", out)
    res["cpu"] = summary(f"decode {fmt} CPU", cpu)
    return res


def summary(label: str, runs: dict[str, list[float]]) -> dict[str, Any]:
    res: dict[str, Any] = {}
    for name, rs in runs.items():
        med = statistics.median(rs)
        print(f"  {label:18s} {name:6s} median {med:>12,.0f} rec/s  runs {[round(r) for r in rs]}", flush=True)
        res[f"{name}_rec_s"] = round(med)
        res[f"{name}_rec_s_runs"] = [round(r) for r in rs]
    ratios = [n / p for n, p in zip(runs["native"], runs["python"], strict=True)]
    res["native_vs_python"] = round(statistics.median(ratios), 2)
    res["native_vs_python_runs"] = [round(r, 2) for r in ratios]
    return res


def job(bootstrap: str, topic: str, ends: dict[int, int], out: Path, reader: str, messages: int,
        **options: Any) -> tuple[float, float]:  # fmt: skip
    from sluice.sinks.files import FileSink

    shutil.rmtree(out, ignore_errors=True)
    p = Pipeline(
        f"wire-{topic}-{reader}",
        parallelism=1,
        restart=NoRestart(),
        checkpoint={"interval": 1.0, "storage": str(out / "chk"), "mode": "exactly_once"},
    )
    src = KafkaSource(
        bootstrap, topic, batch_size=BATCH, stopping_offsets={(topic, q): o for q, o in ends.items()}, reader=reader,
        **options,
    )  # fmt: skip
    p.source(src).sink(FileSink(str(out / "parquet"), format="parquet", compression="snappy"))
    cpu0, t0 = time.process_time(), time.perf_counter()
    p.run(runtime="local", restore="none")
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    files = [os.path.join(d, f) for d, _, fs in os.walk(out / "parquet") for f in fs if f.endswith(".parquet")]
    ids = pa.concat_arrays([pq.read_table(f, columns=["id"]).column("id").combine_chunks() for f in files])
    total = sum(ends.values())
    got = np.sort(ids.to_numpy(zero_copy_only=False))
    if total != messages or not np.array_equal(got, np.arange(messages)):  # the input: ids 0..messages-1, once each
        raise RuntimeError(f"{topic} ({reader}): {len(ids)} rows, expected ids 0..{messages - 1} once each")
    return total / wall, total / cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="wire-decode-"))
    result: dict[str, Any] = {"messages": args.messages, "rounds": args.rounds, "load_before": os.getloadavg()[0]}
    try:
        with TansuBroker() as broker, RecordedSchemaRegistry() as registry:
            i1 = registry.register("orders-value", ORDER_V1)
            i4 = registry.register("events-value", EVENT_V1, "JSON")
            encoders: dict[str, Callable[[int], bytes]] = {
                "avro": lambda i: avro_wire(i1, ORDER_V1, order(i)),
                "json": lambda i: json_wire(i4, event(i)),
            }
            for fmt, enc in encoders.items():
                values = [enc(i) for i in range(args.messages)]
                print(f"{fmt}: {sum(map(len, values)) // len(values)} B a record", flush=True)
                result[f"decode_{fmt}"] = decoding(fmt, registry.url, values, args.rounds)
                topic = f"wire-{fmt}"
                broker.create_topic(topic, PARTITIONS)
                produce(broker.bootstrap, topic, args.messages, enc)
                ends = broker.end_offsets(topic, timeout=60)
                runs: dict[str, list[float]] = {"native": [], "python": []}
                cpu: dict[str, list[float]] = {"native": [], "python": []}
                for r in range(args.rounds):
                    for reader in ("native", "python")[:: 1 if r % 2 == 0 else -1]:
                        w, c = job(broker.bootstrap, topic, ends, work / topic, reader, args.messages, format=fmt,
                                   schema_registry=registry.url)  # fmt: skip
                        runs[reader].append(w)
                        cpu[reader].append(c)
                result[f"job_{fmt}"] = summary(f"job {fmt}", runs)
                result[f"job_{fmt}"]["cpu_rec_s_median"] = {k: round(statistics.median(v)) for k, v in cpu.items()}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["load_after"] = os.getloadavg()[0]
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
