"""What metrics and the control endpoint cost: Kafka -> Parquet with both on, against both off, same run.

Starts a tansu broker (tests/kafka_broker.py), produces ``--messages`` JSON messages of ~140 bytes into 4
partitions (``kafka_ceiling.py``'s data), then runs the same exactly-once job (``KafkaSource(format=
"json")`` -> ``FileSink(parquet)``, local runtime, checkpoints every second, bounded by the end offsets)
both ways:

(a) ``without``: ``Pipeline(metrics=False)``, ``control_endpoint=None`` (no counting at all, no server);
(b) ``with``: metrics on, the endpoint serving, and a scraper (another process, as Prometheus and a
    browser are) fetching ``/metrics`` and ``/api/v1/metrics`` every second.

The metric is named before the run (``--metric``: wall time by default; CPU time of the whole process tree,
the broker and the scraper included, printed beside). The two sides run in alternated rounds
(``--rounds``, at least 3, order rotated) after an untimed warm-up of each (benchmarks/_common.py), each
timed from its start to its end (the last commit visible). ``ratio`` (target, issue 13: >= 0.97) is the
median of the per-round ratios of (b)'s records per second to (a)'s, printed with every round and the
spread; ``cpu_ratio`` is the same by CPU time. Every run's Parquet files are read back and compared with
the produced messages row by row, never counted from the job's metrics. Last line: ``RESULT {json}``
(``ratio``, ``ratio_runs``, ``ratio_spread``, ``cpu_ratio``, ``cpu_ratio_runs``, ``without_rec_s``,
``with_rec_s``, ``runs``).

Usage: python benchmarks/metrics_cost.py [--quick] [--messages 1000000] [--rounds 3] [--metric wall|cpu]
       [--parallelism 2]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/kafka_broker.py imports tests.*
from _checks import ceiling_rows  # type: ignore[import-not-found]
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
from kafka_broker import TansuBroker
from kafka_ceiling import PARTITIONS, SCHEMA, TOPIC, produce  # type: ignore[import-not-found]
from sluice.api import Pipeline
from sluice.config import NoRestart
from sluice.connectors.kafka import KafkaSource
from sluice.sinks.files import FileSink

SIDES = ("without", "with")

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


def run(bootstrap: str, out: Path, ends: dict[int, int], parallelism: int, with_metrics: bool) -> tuple[Timing, int]:
    """One run, from its start to its end: (its timing, the scrapes made while it ran)."""
    p = Pipeline("metrics-bench", parallelism=parallelism, restart=NoRestart(),
                 checkpoint={"interval": 1.0, "storage": str(out / "chk")}, metrics=with_metrics)  # fmt: skip
    src = KafkaSource(bootstrap, TOPIC, format="json", schema=SCHEMA, batch_size=10_000,
                      stopping_offsets={(TOPIC, q): off for q, off in ends.items()})  # fmt: skip
    p.source(src).sink(FileSink(str(out / "parquet"), format="parquet", compression="snappy"))
    with Stopwatch() as sw:
        client = p.start(runtime="local", restore="none", control_endpoint="127.0.0.1:0" if with_metrics else None)
        scraper = None
        if client.control is not None:
            scraper = _scraper(client.control.url, Path(client.control.token_file).read_text())
        result = client.wait()
        sw.stop()
        scrapes = _scrapes(scraper) if scraper is not None else 0
    if client.control is not None:
        client.control.close()
    if result.status != "finished":
        raise RuntimeError(f"the job ended {result.status}")
    return sw.timing, scrapes


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="200k messages")
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--parallelism", type=int, default=2)
    add_round_options(ap)
    args = ap.parse_args()
    if args.quick:
        args.messages = 200_000
    check_rounds(args)
    n = args.messages
    res: dict[str, Any] = {"messages": n, "parallelism": args.parallelism, "metric": args.metric,
                           "rounds": args.rounds, "loadavg_before": load_average()}  # fmt: skip
    expected = ceiling_rows(n)
    runs: list[dict[str, Any]] = []
    work = Path(tempfile.mkdtemp(prefix="metrics-bench-"))
    try:
        with TansuBroker() as broker:
            broker.create_topic(TOPIC, PARTITIONS)
            produce(broker.bootstrap, n)
            ends = broker.end_offsets(TOPIC, timeout=60)
            assert sum(ends.values()) == n, ends

            def one(side: str, r: int) -> Timing:
                out = work / f"run-{r}-{side}"
                timing, scrapes = run(broker.bootstrap, out, ends, args.parallelism, side == "with")
                got = ds.dataset(str(out / "parquet"), format="parquet").to_table()
                differs = same_table(got, expected)
                if differs is not None:
                    raise RuntimeError(f"{side}, round {r}: the Parquet output differs from the input ({differs})")
                shutil.rmtree(out, ignore_errors=True)
                if r:
                    runs.append({"round": r, "metrics": side == "with", "rec_s": round(n / timing.wall),
                                 "rec_cpu_s": round(n / timing.cpu), "scrapes": scrapes})  # fmt: skip
                return timing

            timings = alternate(SIDES, args.rounds, one, warmup=not args.no_warmup,
                                show=lambda t: f"{t}  {n / t.wall:,.0f} rec/s")  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ratios(res, "ratio", timings["with"], timings["without"], args.metric, ">= 0.97")
    other = "cpu" if args.metric == "wall" else "wall"
    for suffix in ("", "_runs", "_spread"):  # the CPU-time ratio under its old name too
        res[f"cpu_ratio{suffix}"] = res[f"ratio{'' if args.metric == 'cpu' else '_' + other}{suffix}"]
    res["without_rec_s"] = round(statistics.median(n / t.wall for t in timings["without"]))
    res["with_rec_s"] = round(statistics.median(n / t.wall for t in timings["with"]))
    res["runs"] = runs
    with_runs(res, "timings_wall_cpu", timings)
    res["loadavg_after"] = load_average()
    print("RESULT " + json.dumps(res))


if __name__ == "__main__":
    main()
