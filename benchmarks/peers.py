"""sluice beside the engines its users would pick instead, on one Apache Kafka topic in one run: Apache Flink
(PyFlink, SQL), Spark Structured Streaming and Quix Streams.

Starts Apache Kafka (tests/apache_kafka.py, KRaft, one JVM), produces ``--messages`` JSON records
``{"user", "amount", "ts"}`` (``user`` out of ``--keys``, each user in one of 4 partitions, ``ts`` spanning
``--minutes`` of event time in order) and after them one record per partition an hour of event time
ahead, which moves every engine's watermark past every window of the data (no engine is told where the
input ends: each job streams until its output holds every record, then it is killed). Cases:

1. ``parquet``: the records into Parquet files, checkpoints every second, exactly once: sluice on its local
   runtime (``sluice-local``) and on embedded Spark (``sluice-spark``), Flink (Kafka SQL source, filesystem
   sink), Spark (Kafka source, Parquet sink with a checkpoint location, default trigger), Quix (its Parquet
   sink; at least once).
2. ``window``: a tumbling one-minute count, sum and max of ``amount`` per user by event time (watermark 10 s
   behind) into Parquet: sluice's window, Flink SQL ``TUMBLE``, Spark ``groupBy(window(...))`` in append
   mode, Quix ``tumbling_window(...).final()``.
3. ``kafka``: the records into a Kafka topic: sluice's KafkaSink and Flink's Kafka sink exactly once, Spark's
   Kafka sink at least once (recorded as such).

Every job is a process of its own, timed from its start to the last record visible in the output
(benchmarks/_peers_watch.py: files committed, or read by a plain ``read_committed`` consumer); CPU is the
job's whole process tree's (JVMs included), peak RSS its tree's. Every output is checked against the input
(the records, or the windows computed from them with pyarrow), never against an engine's counters. Sides
run in alternated rounds per case (``--rounds``, order rotated, an untimed warm-up of each on a small
topic first: benchmarks/_common.py). The metric is named before the run (``--metric``, wall by default).
Then latency rounds (cases 1 and 3): each job started on an empty topic, a record every 0.1 s until its
first output is visible, then ``--latency-rate`` records/s for ``--latency-seconds``; a record's latency is
the time its file (or its consumed batch) was first seen minus the time it was produced (``ts``).
``--quick`` (a smoke run, not a result) runs one job per side and case: for cases 1 and 3 the job is timed
on the records (a topic of its own) and then, still running, gets the latency phase; each phase's elapsed
time is printed (``[phase]``) and kept in the RESULT (``phases_s``).

Targets (medians of per-round ratios of sluice-local's records/s over the peer's): ``vs_flink_parquet``,
``vs_spark_parquet``, ``vs_flink_window``, ``vs_spark_window`` >= 1.5; ``vs_flink_kafka`` >= 1.0; sluice's
latency p99 <= checkpoint interval + 1 s. Last line ``RESULT {json}``.

Usage: python benchmarks/peers.py [--quick] [--messages 1000000] [--rounds 3] [--metric wall|cpu]
       [--cases parquet,window,kafka] [--engines sluice-local,sluice-spark,flink,spark,quix] [--install]
(docs/peers.md: the commands of the quick and the full run, and what each costs.)
(The peers' venvs and jars are installed on first use under ~/.cache/sluice-bench: benchmarks/_peers_env.py.)
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import Timing, add_round_options, alternate, load_average, ratios  # type: ignore[import-not-found]
from _peers_data import (  # type: ignore[import-not-found]
    DELAY_MS,
    PARTITIONS,
    SCHEMA,
    WINDOW_MS,
    check,
    check_order,
    normalized,
    produce,
    read_output,
    records,
    reference_windows,
)
from _peers_env import VERSIONS, install  # type: ignore[import-not-found]
from _peers_latency import SteadyProducer, latencies, latency_round  # type: ignore[import-not-found]
from _peers_watch import JobRun, KafkaWatch, ParquetWatch, run_job  # type: ignore[import-not-found]

from tests.apache_kafka import ApacheKafkaBroker

INTERVAL_S = 1.0
CASES = {"parquet": ("sluice-local", "sluice-spark", "flink", "spark", "quix"),
         "window": ("sluice-local", "flink", "spark", "quix"), "kafka": ("sluice-local", "flink", "spark")}  # fmt: skip
GUARANTEE = {("quix", "parquet"): "at least once", ("quix", "window"): "at least once",
             ("spark", "kafka"): "at least once"}  # fmt: skip
TARGETS = {("flink", "parquet"): ">= 1.5", ("spark", "parquet"): ">= 1.5", ("flink", "window"): ">= 1.5",
           ("spark", "window"): ">= 1.5", ("flink", "kafka"): ">= 1.0"}  # fmt: skip


class Bench:
    """The broker, the topics and every engine's python and jars, shared by the rounds."""

    def __init__(self, args: argparse.Namespace, broker: ApacheKafkaBroker, envs: dict[str, tuple[str, list[str]]],
                 root: Path) -> None:  # fmt: skip
        self.args, self.broker, self.envs, self.root = args, broker, envs, root
        self.runs = 0

    def engine(self, engine: str) -> tuple[str, list[str]]:
        return (sys.executable, []) if engine.startswith("sluice") else self.envs[engine]

    def config(self, engine: str, case: str, topic: str) -> dict[str, Any]:
        self.runs += 1
        name = f"peers-{engine}-{case}-{self.runs}"
        jars = self.engine(engine)[1]
        cfg = {"engine": engine, "case": case, "bootstrap": self.broker.bootstrap, "topic": topic,
               "out": str(self.root / name), "out_topic": f"{name}-out", "group": name, "jars": jars,
               "parallelism": 2, "replicas": self.args.quix_replicas, "interval_s": INTERVAL_S, "delay_ms": DELAY_MS, "window_ms": WINDOW_MS}  # fmt: skip
        if case == "kafka":
            self.broker.create_topic(cfg["out_topic"], PARTITIONS)
        return cfg

    def watch(self, engine: str, cfg: dict[str, Any]) -> Any:
        if cfg["case"] == "kafka":
            return KafkaWatch(self.broker.bootstrap, cfg["out_topic"], PARTITIONS)
        return ParquetWatch(Path(cfg["out"]) / "parquet", "spark" if engine == "spark" else "files")

    def run(self, engine: str, case: str, topic: str, table: pa.Table, ref: pa.Table | None) -> JobRun:
        """One timed run of ``engine`` on ``case`` over ``topic``, its output checked."""
        t0 = time.perf_counter()
        cfg = self.config(engine, case, topic)
        watch = self.watch(engine, cfg)
        expected = ref.num_rows if ref is not None else table.num_rows
        run = run_job(self.engine(engine)[0], cfg, watch, expected, self.args.timeout)
        run.extra = check(f"{engine} {case}", case, normalized(engine, read_output(watch, case), case), table, ref)
        run.extra.update(records=table.num_rows, elapsed_s=time.perf_counter() - t0)
        shutil.rmtree(cfg["out"], ignore_errors=True)
        return run

    def run_with_latency(self, engine: str, case: str, table: pa.Table) -> JobRun:
        """``--quick``'s one job per side and case (``parquet``, ``kafka``): timed on ``table`` (produced into
        a topic of its own) up to its last record visible, then, still running, fed the latency phase's
        steady records (benchmarks/_peers_latency.py) until they are visible too; the output is checked
        against both. Saves a second start of every engine (a JVM's is most of a small run's time)."""
        t0 = time.perf_counter()
        topic = f"peers-quick-{engine}-{case}-{self.runs + 1}"
        self.broker.create_topic(topic, PARTITIONS)
        produce(self.broker.bootstrap, topic, table)
        cfg = self.config(engine, case, topic)
        watch = self.watch(engine, cfg)
        a = self.args
        prod = SteadyProducer(self.broker.bootstrap, topic, a.latency_rate, a.latency_seconds, prime=False)
        prod.start()
        n = table.num_rows

        def seen(visible: int) -> None:
            if visible >= n:
                prod.ready.set()

        try:
            whole = run_job(self.engine(engine)[0], cfg, watch, lambda: None if (t := prod.total()) is None else n + t,
                            a.timeout, seen=seen, split=n)  # fmt: skip
        finally:
            prod.stop.set()
            prod.join()
        assert whole.split is not None
        run = whole.split
        steady = pa.Table.from_pylist([dict(zip(SCHEMA.names, r, strict=True)) for r in prod.rows], SCHEMA)
        run.extra = check(f"{engine} {case}", case, normalized(engine, read_output(watch, case), case),
                          pa.concat_tables([table, steady]), None)  # fmt: skip
        want = int(a.latency_rate * a.latency_seconds)
        run.extra.update(records=n, latency=latencies(f"{engine} {case}", watch, prod.steady_from_ms, want),
                         elapsed_s=time.perf_counter() - t0)  # fmt: skip
        shutil.rmtree(cfg["out"], ignore_errors=True)
        return run


def show(r: JobRun) -> str:
    n, first = r.extra["records"], f"{r.first_visible:.1f}" if r.first_visible is not None else "-"
    return (f"{n / r.wall:10,.0f} rec/s {n / r.cpu:9,.0f} rec/CPU-s  wall {r.wall:6.1f} s (first output "
            f"{first} s)  CPU {r.cpu:6.1f} s  peak RSS {r.peak_rss >> 20:5d} MiB"
            + (f"  duplicates {r.extra['duplicates']}" if r.extra.get("duplicates") else "")
            + (f"  latency p50 {lat['p50_s']:.3f} s p99 {lat['p99_s']:.3f} s" if (lat := r.extra.get("latency")) else "")
            + f"  [{r.extra['elapsed_s']:.0f} s with the check]")  # fmt: skip


def summarize(result: dict[str, Any], case: str, n: int, runs: dict[str, list[JobRun]], metric: str) -> None:
    rows = result.setdefault("table", {}).setdefault(case, {})
    for engine, rs in runs.items():
        rates = [n / r.wall for r in rs]
        rows[engine] = {"rec_s": round(statistics.median(rates)), "rec_s_spread": [round(min(rates)), round(max(rates))],
                        "rec_s_runs": [round(x) for x in rates],
                        "rec_per_cpu_s": round(statistics.median(n / r.cpu for r in rs)),
                        "peak_rss_mib": round(statistics.median(r.peak_rss >> 20 for r in rs)),
                        "first_output_s": round(statistics.median(r.first_visible or 0.0 for r in rs), 1),
                        "guarantee": GUARANTEE.get((engine, case), "exactly once")}  # fmt: skip
    timings = {e: [Timing(r.wall, r.cpu) for r in rs] for e, rs in runs.items()}
    for engine in runs:
        if engine.startswith("sluice") or "sluice-local" not in runs:
            continue
        ratios(result, f"vs_{engine}_{case}", timings["sluice-local"], timings[engine], metric, TARGETS.get((engine, case)))
    if "sluice-spark" in runs and "flink" in runs:
        ratios(result, f"sluice_spark_vs_flink_{case}", timings["sluice-spark"], timings["flink"], metric)


class Phases:
    """Prints each phase's elapsed time (``with phases("name"):``), and the run's so far; ``done`` keeps
    them for the RESULT."""

    def __init__(self) -> None:
        self.t0, self.done = time.perf_counter(), {}  # type: dict[str, float]

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        yield
        now = time.perf_counter()
        self.done[name] = round(now - t, 1)
        print(f"[phase] {name}: {now - t:.1f} s (run so far {(now - self.t0) / 60:.1f} min)", flush=True)


def record_latency(result: dict[str, Any], case: str, lat: dict[str, list[dict[str, float]]]) -> None:
    for engine, xs in lat.items():
        row = result["table"][case].setdefault(engine, {})
        for q in ("p50_s", "p99_s"):
            row[f"latency_{q}"] = round(statistics.median(x[q] for x in xs), 3)
            row[f"latency_{q}_runs"] = [round(x[q], 3) for x in xs]


def _choice_list(ap: argparse.ArgumentParser, option: str, given: str, allowed: list[str]) -> list[str]:
    """``given`` split at commas; an unknown name stops the run before the broker starts, in one line."""
    names = [n.strip() for n in given.split(",") if n.strip()]
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        what = f"unknown {', '.join(map(repr, unknown))}" if unknown else "no name given"
        ap.error(f"{option}: {what} (allowed: {', '.join(allowed)})")
    return names


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--messages", type=int, default=None, help="records (default 1,000,000; --quick 100,000)")
    ap.add_argument("--keys", type=int, default=None, help="users (default 10,000; --quick 1,000)")
    ap.add_argument("--quix-replicas", type=int, default=2, help="Quix processes in its consumer group (one per core)")
    ap.add_argument("--minutes", type=int, default=5, help="event time the data spans (one-minute windows)")
    ap.add_argument("--cases", default="parquet,window,kafka")
    ap.add_argument("--engines", default="sluice-local,sluice-spark,flink,spark,quix")
    ap.add_argument("--latency-rate", type=int, default=5_000, help="records/s of the latency rounds")
    ap.add_argument("--latency-seconds", type=float, default=None, help="default 15; --quick 5")
    ap.add_argument("--latency-rounds", type=int, default=None, help="default: --rounds")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds one job may take")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run, not a result: 100k records, 1 round, no warm-up, each job's latency phase "
                         "in the same job after its timed part (one start per engine and case)")  # fmt: skip
    ap.add_argument("--install", action="store_true", help="install the peers' venvs and jars, then exit")
    add_round_options(ap)
    args = ap.parse_args()
    cases = _choice_list(ap, "--cases", args.cases, list(CASES))
    engines = set(_choice_list(ap, "--engines", args.engines, list(CASES["parquet"])))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the broker and the jobs on a plain kill
    if args.quick:
        args.rounds, args.no_warmup = 1, True
    elif args.rounds < 3:
        raise SystemExit(f"--rounds must be at least 3 (got {args.rounds}): a median of fewer says little")
    args.messages = args.messages or (100_000 if args.quick else 1_000_000)
    args.keys = args.keys or (1_000 if args.quick else 10_000)
    args.latency_seconds = args.latency_seconds or (5.0 if args.quick else 15.0)
    latency_rounds = args.latency_rounds or args.rounds
    phases = Phases()
    with phases("install (the peers' venvs and jars; cached after the first run)"):
        envs = install()
    if args.install:
        return
    result: dict[str, Any] = {"messages": args.messages, "keys": args.keys, "minutes": args.minutes, "rounds": args.rounds,
                              "metric": args.metric, "quick": args.quick, "checkpoint_interval_s": INTERVAL_S,
                              "versions": VERSIONS, "loadavg_before": load_average()}  # fmt: skip
    print(f"metric: {args.metric} time (named before the run; CPU beside), {args.rounds} alternated round(s) per case, "
          f"warm-up {'off' if args.no_warmup else 'on'}, load average {result['loadavg_before']}"
          + ("  [--quick: a smoke run, not a result]" if args.quick else ""), flush=True)  # fmt: skip
    root = Path(tempfile.mkdtemp(prefix="sluice-peers-"))
    try:
        with ExitStack() as stack:
            with phases("broker start"):
                broker = stack.enter_context(ApacheKafkaBroker())
            table, warm = records(args.messages, args.keys, args.minutes), records(20_000, 100, 2)
            with phases("input produced and read back"):
                for topic, t in (("peers-in", table), *(() if args.no_warmup else (("peers-warm", warm),))):
                    broker.create_topic(topic, PARTITIONS)
                    t0 = time.perf_counter()
                    produce(broker.bootstrap, topic, t)
                    print(f"produced {t.num_rows:,} records into {topic} in {time.perf_counter() - t0:.1f} s", flush=True)
                    if check_order(broker.bootstrap, topic) != t.num_rows:
                        raise RuntimeError(f"{topic}: another number of records than the {t.num_rows:,} produced")
            refs = {"peers-in": reference_windows(table), "peers-warm": reference_windows(warm)}
            bench = Bench(args, broker, envs, root)
            for case in cases:
                sides = [e for e in CASES[case] if e in engines]
                both = args.quick and case != "window"  # --quick: the latency phase inside the timed job
                print(f"case {case}: {', '.join(sides)}" + (" (each then its latency phase)" if both else ""), flush=True)

                def one(engine: str, r: int, case: str = case, both: bool = both) -> JobRun:
                    if both:
                        return bench.run_with_latency(engine, case, table)
                    topic, t = ("peers-in", table) if r else ("peers-warm", warm)
                    return bench.run(engine, case, topic, t, refs[topic] if case == "window" else None)

                with phases(f"case {case}"):
                    runs = alternate(sides, args.rounds, one, warmup=not args.no_warmup, show=show)
                summarize(result, case, table.num_rows, runs, args.metric)
                if both:
                    record_latency(result, case, {e: [r.extra["latency"] for r in rs] for e, rs in runs.items()})
            for case in [c for c in cases if c != "window" and not args.quick]:
                sides = [e for e in CASES[case] if e in engines]
                print(f"latency {case}: {args.latency_rate:,} records/s for {args.latency_seconds:.0f} s", flush=True)
                with phases(f"latency {case}"):
                    lat = alternate(sides, latency_rounds, lambda e, r, case=case: latency_round(bench, e, case, args),
                                    warmup=False, show=lambda x: f"p50 {x['p50_s']:.3f} s  p99 {x['p99_s']:.3f} s")  # fmt: skip
                record_latency(result, case, lat)
            p99 = {c: result["table"][c]["sluice-local"].get("latency_p99_s_runs") for c in ("parquet", "kafka")
                   if "sluice-local" in result.get("table", {}).get(c, {})}  # fmt: skip
            if p99 and all(x is not None for x in p99.values()):
                worst = [max(xs) for xs in zip(*p99.values(), strict=True)]  # per round, the worse of the cases
                result["sluice_latency_p99_s"] = round(statistics.median(worst), 3)
                result["sluice_latency_p99_s_runs"] = worst
                met = result["sluice_latency_p99_s"] <= INTERVAL_S + 1
                print(f"sluice latency p99 {result['sluice_latency_p99_s']:.3f} s, rounds {worst} "
                      f"(target <= {INTERVAL_S + 1:.0f} s: {'met' if met else 'NOT MET'})", flush=True)  # fmt: skip
            with phases("broker stop"):
                stack.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result["loadavg_after"] = load_average()
    result["phases_s"] = phases.done
    result["minutes_total"] = round((time.perf_counter() - phases.t0) / 60, 1)
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
