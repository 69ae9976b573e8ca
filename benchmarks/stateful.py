"""Stateful operators against the stateless job, Quix Streams and a per-key KeyedProcessFunction, on one topic.

Starts a tansu broker, produces ``--messages`` JSON events (``user`` out of ``--keys``, ``amount``, ``ts``
spanning ``--minutes`` of event time in order; the message key is the user, each user's events in one
partition) into 4 partitions, and runs on that topic, each job reading it whole:

* ``stateless``: ``KafkaSource -> FileSink(parquet)``, exactly-once checkpoints every second, its files
  compared with the produced events;
* ``window``: the same plus ``key_by("user").window(Tumbling("1m"), time="ts").aggregate(count(),
  sum("amount"), max("amount"))`` (``--backend`` hashmap or rocksdb), its result compared with pyarrow's
  ``group_by`` over the produced events;
* ``keyed_process``: the same aggregation as a ``KeyedProcessFunction`` (today's per-key model: map state of
  window start -> [count, sum, max] and an event-time timer per key and window), compared the same way;
* ``quix``: Quix Streams (benchmark extra ``bench``) ``tumbling_window(1 min).agg(Count, Sum, Max).final()``
  into its local Parquet sink, at-least-once, state in local RocksDB without changelog topics (tansu does
  not report the topic configuration Quix derives them from; less work than its default). Its output is
  compared with the same reference less each user's last window, which ``.final()`` leaves open (it closes
  a key's window on that key's next event, and the input ends).

Every job is timed the same way: from its start (``Pipeline.run``, ``Application.run``: consumer group join
and start-up included) to its end with its last output committed (sluice: ``run()`` returns after the
final commit; Quix: stopped once it processed the last event, its final checkpoint flushing the sink). The
four jobs run in alternated rounds (``--rounds``, at least 3, order rotated), after an untimed warm-up of
each over the first tenth of the topic (benchmarks/_common.py). Ratios of events per second, each the
median of the per-round ratios by the metric named before the run (``--metric``: wall time by default),
with its spread and every round; CPU time of the whole process tree (every job runs in this process; the
broker is its child) beside (``*_cpu``): ``window_vs_stateless`` (target >= 0.6), ``window_vs_quix``
(>= 10), ``window_vs_keyed_process`` (>= 5). Then, in the same run, ``benchmarks/stateful_dedup_join.py``
(its own topics; ``--quick``, ``--rounds``, ``--metric`` passed on) adds ``dedup_vs_stateless`` and
``join_vs_stateless`` (targets >= 0.5) against its own stateless baseline; ``--no-dedup-join`` skips it.
The last line is ``RESULT {json}``.

Usage: python benchmarks/stateful.py [--quick] [--messages 2000000] [--keys 100000] [--backend hashmap]
       [--rounds 3] [--metric wall|cpu] [--no-dedup-join]
(Quix needs ``pip install -e ".[bench]"``, best in a venv of its own: it pins older confluent-kafka.)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from confluent_kafka import Producer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
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
from sluice import KeyedProcessFunction, MapStateDescriptor, NoRestart, Pipeline, windows
from sluice.connectors.kafka import KafkaSource
from sluice.sinks.files import FileSink
from sluice.windows import Tumbling

PARTITIONS = 4
TOPIC = "events"
WINDOW_MS = 60_000
BASE_TS = 1_700_000_000_000
SCHEMA = pa.schema([("user", pa.int64()), ("amount", pa.float64()), ("ts", pa.int64())])


def events(n: int, keys: int, minutes: int) -> pa.Table:
    i = np.arange(n, dtype=np.int64)
    users = (i * 7919) % keys  # every key in every stretch of the topic
    return pa.table(
        {"user": users, "amount": ((i * 37) % 1000) / 10.0, "ts": BASE_TS + i * (minutes * 60_000) // n},
        schema=SCHEMA,
    )


def produce(bootstrap: str, table: pa.Table) -> None:
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
    users, amounts, ts = (table.column(c).to_pylist() for c in ("user", "amount", "ts"))
    for j, (u, a, t) in enumerate(zip(users, amounts, ts, strict=True)):
        value = json.dumps({"user": u, "amount": a, "ts": t}).encode()
        while True:
            try:  # in event-time order within each partition: no record is late
                p.produce(TOPIC, value, key=str(u).encode(), partition=j % PARTITIONS)
                break
            except BufferError:
                p.poll(0.05)
    if p.flush(600) != 0:
        raise RuntimeError("messages not delivered")


class PerKeyWindows(KeyedProcessFunction):
    """Tumbling 1-minute count/sum/max written as a KeyedProcessFunction: per key, map state of window
    start -> [count, sum, max] and an event-time timer at each window's end."""

    def open(self, ctx: Any) -> None:
        self.acc = MapStateDescriptor("acc")

    def process(self, key: Any, rows: pa.RecordBatch, ctx: Any) -> None:
        st = ctx.state(self.acc)
        for t, a in zip(rows.column("ts").to_pylist(), rows.column("amount").to_pylist(), strict=True):
            ws = t - t % WINDOW_MS
            cur = st.get(ws)
            if cur is None:
                st.put(ws, [1, a, a])
                ctx.timer_service.register_event_time_timer(ws + WINDOW_MS - 1)
            else:
                st.put(ws, [cur[0] + 1, cur[1] + a, a if a > cur[2] else cur[2]])

    def on_timer(self, timestamp: int, key: Any, ctx: Any) -> list[dict[str, Any]]:
        st = ctx.state(self.acc)
        ws = timestamp - WINDOW_MS + 1
        c, s, m = st.get(ws)
        st.remove(ws)
        return [
            {
                "user": key,
                "window_start": ws,
                "window_end": ws + WINDOW_MS,
                "count": c,
                "sum_amount": s,
                "max_amount": m,
            }
        ]


def sluice_job(kind: str, bootstrap: str, ends: dict[int, int], out: Path, args: argparse.Namespace) -> Timing:
    backend = {"type": "rocksdb", "incremental": True} if args.backend == "rocksdb" else None
    p = Pipeline(
        f"stateful-{kind}",
        parallelism=args.parallelism,
        restart=NoRestart(),
        checkpoint={"interval": 1.0, "storage": str(out / "chk"), "mode": "exactly_once"},
        state_backend=backend,
    )
    src = KafkaSource(
        bootstrap,
        TOPIC,
        format="json",
        schema=SCHEMA,
        batch_size=10_000,
        stopping_offsets={(TOPIC, q): o for q, o in ends.items()},
        event_time="ts" if kind != "stateless" else None,
    )
    s = p.source(src)
    if kind == "window":
        s = (
            s.key_by("user")
            .window(Tumbling("1m"), time="ts")
            .aggregate(windows.count(), windows.sum("amount"), windows.max("amount"))
        )
    elif kind == "keyed_process":
        s = s.key_by("user").process(PerKeyWindows())
    s.sink(FileSink(str(out / "parquet"), format="parquet", compression="snappy"))
    with Stopwatch() as sw:  # run() returns after the last commit: the last record is visible
        p.run(runtime="local", restore="none")
    return sw.timing


def reference(table: pa.Table) -> pa.Table:
    """pyarrow's tumbling 1-minute count/sum/max per user over the whole input."""
    start = pc.multiply(pc.divide(table.column("ts"), WINDOW_MS), WINDOW_MS)
    t = table.append_column("window_start", start)
    return t.group_by(["user", "window_start"]).aggregate(
        [("user", "count"), ("amount", "sum"), ("amount", "max")]
    )


def without_last_windows(ref: pa.Table) -> pa.Table:
    """``ref`` less each user's last window: what Quix's ``.final()`` emits when the input ends."""
    last = ref.group_by("user").aggregate([("window_start", "max")])
    joined = ref.join(last, "user")
    return joined.filter(pc.less(joined.column("window_start"), joined.column("window_start_max"))).drop_columns(
        ["window_start_max"]
    )


def check(kind: str, got: pa.Table, expected: pa.Table) -> None:
    """Compare a job's output with the reference computed from the produced events ``expected``."""
    if kind == "stateless":
        differs = same_table(got.select(SCHEMA.names), expected, keys=("ts", "user", "amount"))
        if differs is not None:
            raise RuntimeError(f"stateless: the files differ from the produced events ({differs})")
        return
    ref = reference(expected)
    if kind == "quix":
        ref = without_last_windows(ref)
    key = ["user", "window_start"]
    g = got.select([*key, "count", "sum_amount", "max_amount"]).sort_by([(k, "ascending") for k in key])
    r = ref.select([*key, "user_count", "amount_sum", "amount_max"]).sort_by([(k, "ascending") for k in key])
    same = g.num_rows == r.num_rows and all(
        g.column(a).equals(r.column(b)) for a, b in zip(g.column_names[:3], r.column_names[:3], strict=True)
    )
    same = same and bool(
        pc.all(pc.less(pc.abs(pc.subtract(g.column("sum_amount"), r.column("amount_sum"))), 1e-6)).as_py()
    )
    same = same and g.column("max_amount").equals(r.column("amount_max"))
    if not same:
        raise RuntimeError(f"{kind}: {g.num_rows} window rows differ from pyarrow's ({r.num_rows})")


def quix_installed() -> bool:
    try:
        import quixstreams  # noqa: F401
    except ImportError:
        print("  quix: not installed (pip install -e '.[bench]')", flush=True)
        return False
    return True


def quix(bootstrap: str, n: int, out: Path) -> Timing:
    """Quix Streams on the same topic, from ``Application.run`` to its stop after the ``n``-th processed
    event (its final checkpoint flushes the sink); its Parquet output is read back by :func:`quix_output`."""
    from quixstreams import Application
    from quixstreams.dataframe.windows import Count, Max, Sum
    from quixstreams.sinks.community.file.local import LocalFileSink

    seen = [0]

    def processed(topic: str, partition: int, offset: int) -> None:
        seen[0] += 1
        if seen[0] == n:
            app.stop()  # the run loop ends, then commits its checkpoint (sink flushed): the output is complete

    app = Application(
        broker_address=bootstrap,
        consumer_group=f"quix-bench-{out.name}",
        auto_offset_reset="earliest",
        state_dir=str(out / "state"),
        on_message_processed=processed,
        loglevel="WARNING",
        # tansu answers DescribeConfigs without retention.ms, which Quix needs to create changelog topics:
        # its state stays in local RocksDB only (less work than its default)
        use_changelog_topics=False,
    )
    topic = app.topic(TOPIC, value_deserializer="json", timestamp_extractor=lambda v, h, ts, tt: v["ts"])
    topic.broker_config.extra_config.setdefault("retention.ms", "-1")  # tansu does not report it
    sdf = app.dataframe(topic)
    sdf = (
        sdf.tumbling_window(duration_ms=WINDOW_MS)
        .agg(count=Count(), sum_amount=Sum("amount"), max_amount=Max("amount"))
        .final()
    )
    out.mkdir(parents=True, exist_ok=True)
    here = os.getcwd()
    os.chdir(out)  # its sink takes a plain folder name (no "/")
    try:
        sdf.sink(LocalFileSink(directory="parquet", format="parquet"))
        with Stopwatch() as sw:
            app.run(timeout=120.0)  # the timeout only guards against a hang: it stops after n events
    finally:
        os.chdir(here)
    if seen[0] < n:
        raise RuntimeError(f"quix: processed {seen[0]} of {n} messages")
    return sw.timing


def quix_output(out: Path) -> pa.Table:
    """Quix's Parquet files as the window rows (``_key`` the user, ``start`` the window start)."""
    got = ds.dataset(str(out / "parquet"), format="parquet").to_table()
    return pa.table({"user": pc.cast(got.column("_key"), pa.int64()), "window_start": got.column("start"),
                     "count": got.column("count"), "sum_amount": got.column("sum_amount"),
                     "max_amount": got.column("max_amount")})  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=2_000_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--minutes", type=int, default=5)
    ap.add_argument("--parallelism", type=int, default=1)
    ap.add_argument("--backend", choices=["hashmap", "rocksdb"], default="hashmap")
    ap.add_argument("--quick", action="store_true", help="200k events over 10k keys")
    ap.add_argument("--no-dedup-join", action="store_true", help="skip benchmarks/stateful_dedup_join.py")
    add_round_options(ap)
    args = ap.parse_args()
    if args.quick:
        args.messages, args.keys = 200_000, 10_000
    check_rounds(args)
    work = Path(tempfile.mkdtemp(prefix="stateful-"))
    n = args.messages
    result: dict[str, Any] = {
        k: getattr(args, k) for k in ("messages", "keys", "minutes", "parallelism", "backend", "metric", "rounds")
    }
    result["loadavg_before"] = load_average()
    sides = ["stateless", "window", "keyed_process", *(["quix"] if quix_installed() else [])]
    try:
        with TansuBroker() as broker:
            table = events(n, args.keys, args.minutes)
            broker.create_topic(TOPIC, PARTITIONS)
            t0 = time.perf_counter()
            produce(broker.bootstrap, table)
            print(f"produced {n:,} events in {time.perf_counter() - t0:.1f} s", flush=True)
            ends = broker.end_offsets(TOPIC, timeout=60)
            warm = {p: o // 10 or 1 for p, o in ends.items()}  # the warm-up reads a tenth of the topic

            def run(kind: str, r: int) -> Timing:
                out = work / f"{kind}-{r}"
                if kind == "quix":
                    timing = quix(broker.bootstrap, n if r else sum(warm.values()), out)
                    got = quix_output(out) if r else None
                else:
                    timing = sluice_job(kind, broker.bootstrap, ends if r else warm, out, args)
                    got = ds.dataset(str(out / "parquet"), format="parquet").to_table() if r else None
                if got is not None:
                    check(kind, got, table)
                shutil.rmtree(out, ignore_errors=True)
                return timing

            timings = alternate(sides, args.rounds, run, warmup=not args.no_warmup)
        for metric, name in (("wall", "rates_ev_s"), ("cpu", "cpu_rates_ev_s")):  # medians over the rounds
            result[name] = {k: round(n / statistics.median(t.of(metric) for t in v)) for k, v in timings.items()}
        for key, other, target in (("window_vs_stateless", "stateless", ">= 0.6"),
                                   ("window_vs_keyed_process", "keyed_process", ">= 5"), ("window_vs_quix", "quix", ">= 10")):  # fmt: skip
            if other in timings:
                ratios(result, key, timings["window"], timings[other], args.metric, target)
            else:
                result[key] = None
        with_runs(result, "timings_wall_cpu", timings)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if not args.no_dedup_join:
        result.update(dedup_join(args))
    result["loadavg_after"] = load_average()
    print("RESULT " + json.dumps(result))


def dedup_join(args: argparse.Namespace) -> dict[str, Any]:
    """Run benchmarks/stateful_dedup_join.py (its output passed through) and return its RESULT's ratios
    (each with its rounds and spread)."""
    script = Path(__file__).with_name("stateful_dedup_join.py")
    flags = [*(["--quick"] if args.quick else []), "--rounds", str(args.rounds), "--metric", args.metric,
             *(["--no-warmup"] if args.no_warmup else [])]  # fmt: skip
    run = subprocess.run([sys.executable, str(script), *flags], capture_output=True, text=True)
    print(run.stdout, end="", flush=True)
    if run.returncode != 0:
        raise RuntimeError(f"stateful_dedup_join.py failed: {run.stderr[-3000:]}")
    found = json.loads(run.stdout.strip().splitlines()[-1].removeprefix("RESULT "))
    other = "cpu" if args.metric == "wall" else "wall"
    keys = [f"{k}{m}{part}" for k in ("dedup_vs_stateless", "join_vs_stateless") for m in ("", f"_{other}")
            for part in ("", "_runs", "_spread")]  # fmt: skip
    return {k: found[k] for k in keys} | {"dedup_join_events_per_s": found["events_per_s"],
                                          "dedup_join_duplicate_share": found["duplicate_share"]}  # fmt: skip


if __name__ == "__main__":
    main()
