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

Targets (medians of per-round ratios of sluice-local's records/s over the peer's): ``vs_flink_parquet``,
``vs_spark_parquet``, ``vs_flink_window``, ``vs_spark_window`` >= 1.5; ``vs_flink_kafka`` >= 1.0; sluice's
latency p99 <= checkpoint interval + 1 s. Last line ``RESULT {json}``.

Usage: python benchmarks/peers.py [--quick] [--messages 1000000] [--rounds 3] [--metric wall|cpu]
       [--cases parquet,window,kafka] [--install]
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
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import Timing, add_round_options, alternate, load_average, ratios, same_table  # type: ignore[import-not-found]
from _peers_env import VERSIONS, install  # type: ignore[import-not-found]
from _peers_latency import latency_round  # type: ignore[import-not-found]
from _peers_watch import JobRun, KafkaWatch, ParquetWatch, run_job  # type: ignore[import-not-found]
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.apache_kafka import ApacheKafkaBroker

PARTITIONS = 4
WINDOW_MS = 60_000
DELAY_MS = 10_000
INTERVAL_S = 1.0
BASE_TS = 1_700_000_000_000
SCHEMA = pa.schema([("user", pa.int64()), ("amount", pa.float64()), ("ts", pa.int64())])
CASES = {"parquet": ("sluice-local", "sluice-spark", "flink", "spark", "quix"),
         "window": ("sluice-local", "flink", "spark", "quix"), "kafka": ("sluice-local", "flink", "spark")}  # fmt: skip
GUARANTEE = {("quix", "parquet"): "at least once", ("quix", "window"): "at least once",
             ("spark", "kafka"): "at least once"}  # fmt: skip
TARGETS = {("flink", "parquet"): ">= 1.5", ("spark", "parquet"): ">= 1.5", ("flink", "window"): ">= 1.5",
           ("spark", "window"): ">= 1.5", ("flink", "kafka"): ">= 1.0"}  # fmt: skip


def records(n: int, keys: int, minutes: int) -> pa.Table:
    """The data records (``user`` in partition ``user % PARTITIONS``) and one sentinel per partition an hour
    of event time after them."""
    i = np.arange(n, dtype=np.int64)
    data = pa.table({"user": (i * 7919) % keys, "amount": ((i * 37) % 1000) / 10.0,
                     "ts": BASE_TS + i * (minutes * 60_000) // n}, schema=SCHEMA)  # fmt: skip
    far = BASE_TS + minutes * 60_000 + 3_600_000
    first = -(-keys // PARTITIONS) * PARTITIONS  # sentinel users: past every data user, one per partition
    sentinels = pa.table({"user": first + np.arange(PARTITIONS),
                          "amount": np.zeros(PARTITIONS), "ts": np.full(PARTITIONS, far)}, schema=SCHEMA)  # fmt: skip
    return pa.concat_tables([data, sentinels])


#: the input's producer: idempotent, because without it librdkafka's retry of a failed produce request (a
#: just-created partition whose leader is not ready yet, on a loaded machine) lands that batch behind the
#: batches sent after it, and a partition is no longer in event-time order (seen: records a minute of event
#: time behind their partition's sentinel an hour ahead, late for every engine's watermark)
PRODUCER_CONF = {"linger.ms": 20, "batch.num.messages": 10_000, "queue.buffering.max.messages": 2_000_000,
                 "enable.idempotence": True, "log_level": 0}  # fmt: skip


def produce(bootstrap: str, topic: str, table: pa.Table) -> None:
    p = Producer({"bootstrap.servers": bootstrap, **PRODUCER_CONF})
    for u, a, t in zip(*(table.column(c).to_pylist() for c in SCHEMA.names), strict=True):
        while True:
            try:  # each partition in event-time order: no record is late
                p.produce(topic, b'{"user": %d, "amount": %r, "ts": %d}' % (u, a, t), key=b"%d" % u, partition=u % PARTITIONS)
                break
            except BufferError:
                p.poll(0.05)
    if p.flush(600) != 0:
        raise RuntimeError("records not delivered")


def _decode(values: list[bytes]) -> pa.Table:
    """JSON record values as a table of SCHEMA."""
    return pajson.read_json(pa.py_buffer(b"\n".join(values)), parse_options=pajson.ParseOptions(explicit_schema=SCHEMA))


def check_order(bootstrap: str, topic: str) -> int:
    """Read ``topic`` back with a plain consumer and raise unless each partition's ``ts`` never goes back
    (the premise of the ``window`` case: no record is late for a watermark ``DELAY_MS`` behind); returns the
    records read."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-order-check", "enable.auto.commit": False,
                  "log_level": 0})  # fmt: skip
    try:
        parts = sorted(c.list_topics(topic, timeout=30).topics[topic].partitions)
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in parts}
        c.assign([TopicPartition(topic, p, 0) for p in parts if ends[p] > 0])
        last, pos, n, deadline = dict.fromkeys(parts, -(2**63)), dict.fromkeys(parts, 0), 0, time.time() + 600
        while any(pos[p] < ends[p] for p in parts):
            if time.time() > deadline:
                raise RuntimeError(f"{topic}: could not read the input back within 600 s")
            msgs = [m for m in c.consume(10_000, 1.0) if m.error() is None]
            if not msgs:
                continue
            ts = _decode([m.value() for m in msgs]).column("ts").to_pylist()
            for m, t in zip(msgs, ts, strict=True):
                p = m.partition()
                if t < last[p]:
                    raise RuntimeError(f"{topic}[{p}] offset {m.offset()}: ts {t} is {last[p] - t} ms behind the "
                                       "records before it: the input is not in event-time order per partition")  # fmt: skip
                last[p], pos[p] = t, m.offset() + 1
            n += len(msgs)
        return n
    finally:
        c.close()


def reference_windows(table: pa.Table) -> pa.Table:
    """The windows of the data records (the sentinels' windows never close), by pyarrow's group_by."""
    data = table.filter(pc.less(table.column("ts"), pc.max(table.column("ts"))))
    start = pc.multiply(pc.divide(data.column("ts"), WINDOW_MS), WINDOW_MS)
    agg = data.append_column("window_start", start).group_by(["user", "window_start"]).aggregate(
        [("user", "count"), ("amount", "sum"), ("amount", "max")])  # fmt: skip
    return agg.rename_columns(["user", "window_start", "count", "sum_amount", "max_amount"])


def normalized(engine: str, got: pa.Table, case: str) -> pa.Table:
    """An engine's output as (user, amount, ts) or (user, window_start ms, count, sum_amount, max_amount)."""
    if engine == "quix":
        got = got.append_column("user", pc.cast(got.column("_key"), pa.int64())) if case == "window" else got
        if case == "window":
            got = got.append_column("window_start", got.column("start"))
    if case != "window":
        return got.select(SCHEMA.names).cast(SCHEMA)
    ws = got.column("window_start")
    if pa.types.is_timestamp(ws.type):
        ws = pc.cast(pc.cast(ws, pa.timestamp("ms")), pa.int64())
    return pa.table({"user": pc.cast(got.column("user"), pa.int64()), "window_start": pc.cast(ws, pa.int64()),
                     "count": pc.cast(got.column("count"), pa.int64()), "sum_amount": got.column("sum_amount"),
                     "max_amount": got.column("max_amount")})  # fmt: skip


def check(label: str, case: str, got: pa.Table, table: pa.Table, ref: pa.Table | None) -> dict[str, Any]:
    """Compare an output with the input (or the windows computed from it); raise on any difference."""
    if case != "window":
        dupes = got.num_rows - table.num_rows
        if dupes > 0:  # at least once: compare the distinct records, report the copies
            got = pa.Table.from_pylist(list({json.dumps(r): r for r in got.to_pylist()}.values()), SCHEMA)
        differs = same_table(got, table, keys=("ts", "user", "amount"))
        if differs is not None:
            raise RuntimeError(f"{label}: the output differs from the input ({differs})")
        return {"duplicates": max(0, dupes)}
    assert ref is not None
    key = [("user", "ascending"), ("window_start", "ascending")]
    g, r = got.sort_by(key), ref.sort_by(key)
    same = g.num_rows == r.num_rows and all(g.column(c).equals(r.column(c)) for c in ("user", "window_start", "count", "max_amount"))
    if not same or not pc.all(pc.less(pc.abs(pc.subtract(g.column("sum_amount"), r.column("sum_amount"))), 1e-6)).as_py():
        raise RuntimeError(f"{label}: {g.num_rows} window rows differ from the {r.num_rows} computed from the input")
    return {}


def read_output(watch: Any, case: str) -> pa.Table:
    if isinstance(watch, KafkaWatch):
        values = [v for _, vs in watch.batches for v in vs]
        return _decode(values)
    tables = [pq.read_table(p) for p in watch.files]
    return pa.concat_tables(tables, promote_options="permissive") if tables else SCHEMA.empty_table()


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
        cfg = self.config(engine, case, topic)
        watch = self.watch(engine, cfg)
        expected = ref.num_rows if ref is not None else table.num_rows
        run = run_job(self.engine(engine)[0], cfg, watch, expected, self.args.timeout)
        run.extra = check(f"{engine} {case}", case, normalized(engine, read_output(watch, case), case), table, ref)
        run.extra["records"] = table.num_rows
        shutil.rmtree(cfg["out"], ignore_errors=True)
        return run


def show(r: JobRun) -> str:
    n, first = r.extra["records"], f"{r.first_visible:.1f}" if r.first_visible is not None else "-"
    return (f"{n / r.wall:10,.0f} rec/s {n / r.cpu:9,.0f} rec/CPU-s  wall {r.wall:6.1f} s (first output "
            f"{first} s)  CPU {r.cpu:6.1f} s  peak RSS {r.peak_rss >> 20:5d} MiB"
            + (f"  duplicates {r.extra['duplicates']}" if r.extra.get("duplicates") else ""))  # fmt: skip


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


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--messages", type=int, default=None, help="records (default 1,000,000; --quick 100,000)")
    ap.add_argument("--keys", type=int, default=None, help="users (default 10,000; --quick 1,000)")
    ap.add_argument("--quix-replicas", type=int, default=2, help="Quix processes in its consumer group (one per core)")
    ap.add_argument("--minutes", type=int, default=5, help="event time the data spans (one-minute windows)")
    ap.add_argument("--cases", default="parquet,window,kafka")
    ap.add_argument("--engines", default="sluice-local,sluice-spark,flink,spark,quix")
    ap.add_argument("--latency-rate", type=int, default=5_000, help="records/s of the latency rounds")
    ap.add_argument("--latency-seconds", type=float, default=15.0)
    ap.add_argument("--latency-rounds", type=int, default=None, help="default: --rounds")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds one job may take")
    ap.add_argument("--quick", action="store_true", help="100k records, 1 round, no warm-up: a smoke run, not a result")
    ap.add_argument("--install", action="store_true", help="install the peers' venvs and jars, then exit")
    add_round_options(ap)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the broker and the jobs on a plain kill
    if args.quick:
        args.rounds, args.no_warmup, args.latency_seconds = 1, True, 8.0
    elif args.rounds < 3:
        raise SystemExit(f"--rounds must be at least 3 (got {args.rounds}): a median of fewer says little")
    args.messages = args.messages or (100_000 if args.quick else 1_000_000)
    args.keys = args.keys or (1_000 if args.quick else 10_000)
    latency_rounds = args.latency_rounds or args.rounds
    t_start = time.time()
    envs = install()
    if args.install:
        return
    cases, engines = args.cases.split(","), set(args.engines.split(","))
    result: dict[str, Any] = {"messages": args.messages, "keys": args.keys, "minutes": args.minutes, "rounds": args.rounds,
                              "metric": args.metric, "quick": args.quick, "checkpoint_interval_s": INTERVAL_S,
                              "versions": VERSIONS, "loadavg_before": load_average()}  # fmt: skip
    print(f"metric: {args.metric} time (named before the run; CPU beside), {args.rounds} alternated round(s) per case, "
          f"warm-up {'off' if args.no_warmup else 'on'}, load average {result['loadavg_before']}"
          + ("  [--quick: a smoke run, not a result]" if args.quick else ""), flush=True)  # fmt: skip
    root = Path(tempfile.mkdtemp(prefix="sluice-peers-"))
    try:
        with ApacheKafkaBroker() as broker:
            table, warm = records(args.messages, args.keys, args.minutes), records(20_000, 100, 2)
            for topic, t in (("peers-in", table), ("peers-warm", warm)):
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
                print(f"case {case}: {', '.join(sides)}", flush=True)

                def one(engine: str, r: int, case: str = case) -> JobRun:
                    topic, t = ("peers-in", table) if r else ("peers-warm", warm)
                    return bench.run(engine, case, topic, t, refs[topic] if case == "window" else None)

                runs = alternate(sides, args.rounds, one, warmup=not args.no_warmup, show=show)
                summarize(result, case, table.num_rows, runs, args.metric)
            for case in [c for c in cases if c != "window"]:
                sides = [e for e in CASES[case] if e in engines]
                print(f"latency {case}: {args.latency_rate:,} records/s for {args.latency_seconds:.0f} s", flush=True)
                lat = alternate(sides, latency_rounds, lambda e, r, case=case: latency_round(bench, e, case, args),
                                warmup=False, show=lambda x: f"p50 {x['p50_s']:.3f} s  p99 {x['p99_s']:.3f} s")  # fmt: skip
                for engine, xs in lat.items():
                    row = result["table"][case].setdefault(engine, {})
                    for q in ("p50_s", "p99_s"):
                        row[f"latency_{q}"] = round(statistics.median(x[q] for x in xs), 3)
                        row[f"latency_{q}_runs"] = [round(x[q], 3) for x in xs]
            p99 = [result["table"][c]["sluice-local"].get("latency_p99_s") for c in ("parquet", "kafka") if c in result["table"]]
            if p99 and all(x is not None for x in p99):
                result["sluice_latency_p99_s"] = max(p99)
                met = max(p99) <= INTERVAL_S + 1
                print(f"sluice latency p99 {max(p99):.3f} s (target <= {INTERVAL_S + 1:.0f} s: {'met' if met else 'NOT MET'})")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result["loadavg_after"] = load_average()
    result["minutes_total"] = round((time.time() - t_start) / 60, 1)
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
