"""What metrics and the control endpoint cost: Kafka -> Parquet with both on, against both off, same run.

Starts a tansu broker (tests/kafka_broker.py), produces ``--messages`` JSON messages of ~140 bytes into 4
partitions, then runs the same exactly-once job (``KafkaSource(format="json")`` -> ``FileSink(parquet)``,
local runtime, checkpoints every second, bounded by the end offsets) ``--rounds`` times each way,
alternating:

(a) without: ``Pipeline(metrics=False)``, ``control_endpoint=None`` (no counting at all, no server);
(b) with: metrics on, the endpoint serving, and a scraper (another process, as Prometheus and a browser
    are) fetching ``/metrics`` and ``/api/v1/metrics`` every second.

Target (issue 13): (b) >= 0.97x (a). Each round runs (a) and (b) back to back (in alternating order), so
a round's ratio compares runs under the same load; ``ratio`` is the median of the rounds' ratios of
wall-clock throughput. On a shared machine whose load swings, ``cpu_ratio`` (records per CPU-second of
this process, which other processes' load hardly moves) is the steadier figure. The last line is
``RESULT {"ratio": ..., "cpu_ratio": ..., "without_rec_s": ..., "with_rec_s": ..., "runs": [...]}``.

Usage: python benchmarks/metrics_cost.py [--messages 1000000] [--rounds 3] [--parallelism 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/kafka_broker.py imports tests.*
from kafka_broker import TansuBroker
from kafka_ceiling import PARTITIONS, SCHEMA, TOPIC, produce
from sluice.api import Pipeline
from sluice.config import NoRestart
from sluice.connectors.kafka import KafkaSource
from sluice.sinks.files import FileSink

#: the scraper: another process, as Prometheus and a browser are; prints how many requests it made
SCRAPER = """
import sys, time, urllib.request
url, token, n = sys.argv[1], sys.argv[2], 0
headers = {"Authorization": "Bearer " + token}
while True:
    time.sleep(1.0)
    for path in ("/metrics", "/api/v1/metrics"):
        try:
            urllib.request.urlopen(urllib.request.Request(url + path, headers=headers), timeout=10).read()
            n += 1
            print(n, flush=True)
        except OSError:
            pass
"""


def _scraper(url: str, token: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", SCRAPER, url, token], stdout=subprocess.PIPE, text=True)


def _scrapes(proc: subprocess.Popen[str]) -> int:
    proc.terminate()
    out, _ = proc.communicate(timeout=10)
    return int(out.split()[-1]) if out.split() else 0


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run(
    bootstrap: str, n: int, out: Path, ends: dict[int, int], parallelism: int, with_metrics: bool
) -> tuple[float, float]:
    """One run: (records per wall-clock second, records per CPU-second of this process)."""
    p = Pipeline(
        "metrics-bench",
        parallelism=parallelism,
        restart=NoRestart(),
        checkpoint={"interval": 1.0, "storage": str(out / "chk")},
        metrics=with_metrics,
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
    t0, c0 = time.perf_counter(), _cpu()
    client = p.start(runtime="local", restore="none", control_endpoint="127.0.0.1:0" if with_metrics else None)
    scraper = None
    if client.control is not None:
        scraper = _scraper(client.control.url, Path(client.control.token_file).read_text())
    result = client.wait()
    dt, cpu = time.perf_counter() - t0, _cpu() - c0
    scrapes = _scrapes(scraper) if scraper is not None else 0
    if client.control is not None:
        client.control.close()
    rows = sum(
        pq.ParquetFile(os.path.join(d, f)).metadata.num_rows
        for d, _, fs in os.walk(out / "parquet")
        for f in fs
        if f.endswith(".parquet") and not f.startswith(".")
    )
    if rows != n or result.status != "finished":
        raise RuntimeError(f"committed {rows} rows ({result.status}), expected {n}")
    label = "with   " if with_metrics else "without"
    extra = f", {scrapes} scrapes" if with_metrics else ""
    print(f"  {label} metrics and endpoint: {n / dt:,.0f} rec/s, {n / cpu:,.0f} rec/cpu-s ({dt:.2f}s{extra})", flush=True)
    return n / dt, n / cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--parallelism", type=int, default=2)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="metrics-bench-"))
    rates: dict[bool, list[float]] = {False: [], True: []}
    cpu: dict[bool, list[float]] = {False: [], True: []}
    round_ratios: list[float] = []
    runs: list[dict[str, Any]] = []
    try:
        with TansuBroker() as broker:
            broker.create_topic(TOPIC, PARTITIONS)
            produce(broker.bootstrap, args.messages)
            ends = broker.end_offsets(TOPIC, timeout=60)
            assert sum(ends.values()) == args.messages, ends
            for r in range(args.rounds):
                got: dict[bool, float] = {}
                for with_metrics in ((False, True) if r % 2 == 0 else (True, False)):
                    out = work / f"run-{r}-{with_metrics}"
                    rate, per_cpu = run(broker.bootstrap, args.messages, out, ends, args.parallelism, with_metrics)
                    shutil.rmtree(out, ignore_errors=True)
                    rates[with_metrics].append(rate)
                    cpu[with_metrics].append(per_cpu)
                    got[with_metrics] = rate
                    runs.append({"round": r, "metrics": with_metrics, "rec_s": round(rate), "rec_cpu_s": round(per_cpu)})
                round_ratios.append(got[True] / got[False])
                print(f"round {r}: with / without = {round_ratios[-1]:.3f}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    without, with_ = statistics.median(rates[False]), statistics.median(rates[True])
    ratio = statistics.median(round_ratios)
    cpu_ratio = statistics.median(cpu[True]) / statistics.median(cpu[False])
    print(
        f"median without: {without:,.0f} rec/s, with: {with_:,.0f} rec/s; median of the rounds' ratios "
        f"{ratio:.3f}x; per CPU-second {cpu_ratio:.3f}x",
        flush=True,
    )
    print(
        "RESULT "
        + json.dumps(
            {
                "messages": args.messages,
                "parallelism": args.parallelism,
                "ratio": round(ratio, 3),
                "cpu_ratio": round(cpu_ratio, 3),
                "without_rec_s": round(without),
                "with_rec_s": round(with_),
                "runs": runs,
            }
        )
    )


if __name__ == "__main__":
    main()
