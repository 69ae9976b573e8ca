"""Stateful operators against the stateless job, Quix Streams and a per-key KeyedProcessFunction, on one topic.

Starts a tansu broker, produces ``--messages`` JSON events (``user`` out of ``--keys``, ``amount``, ``ts``
spanning ``--minutes`` of event time in order; the message key is the user) into 4 partitions, and runs
on that topic, one after another, each reading it whole into Parquet files:

* ``stateless``: ``KafkaSource -> FileSink(parquet)``, exactly-once checkpoints every second;
* ``window``: the same plus ``key_by("user").window(Tumbling("1m"), time="ts").aggregate(count(),
  sum("amount"), max("amount"))`` (``--backend`` hashmap or rocksdb), its result checked against pyarrow's
  ``group_by`` over the produced events;
* ``keyed_process``: the same aggregation as a ``KeyedProcessFunction`` (today's per-key model: map state of
  window start -> [count, sum, max] and an event-time timer per key and window);
* ``quix``: Quix Streams (benchmark extra ``bench``) ``tumbling_window(1 min).agg(Count, Sum, Max).final()``
  into its local Parquet sink, at-least-once, state in local RocksDB without changelog topics (tansu does
  not report the topic configuration Quix derives them from); its rate is the events over the time from
  its first processed event to its last (its start and consumer-group join left out, unlike sluice's jobs,
  whose times include their start).

Ratios: ``window_vs_stateless`` (target >= 0.6), ``window_vs_quix`` (>= 10), ``window_vs_keyed_process``
(>= 5). Then, in the same run, ``benchmarks/stateful_dedup_join.py`` (its own topics: deduplication needs
10M distinct keys, the join 1M dimension rows; ``--quick`` passed on) adds ``dedup_vs_stateless`` and
``join_vs_stateless`` (targets >= 0.5) against its own stateless baseline; ``--no-dedup-join`` skips it.
Each ratio also by CPU time of this process (``*_cpu``; every job, Quix's included, runs in it), which a
shared machine's load disturbs less than wall time.
The last line is ``RESULT {json}``.

Usage: python benchmarks/stateful.py [--quick] [--messages 2000000] [--keys 100000] [--backend hashmap]
(Quix needs ``pip install -e ".[bench]"``, best in a venv of its own: it pins older confluent-kafka.)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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
from kafka_broker import TansuBroker
from sluice import KeyedProcessFunction, MapStateDescriptor, NoRestart, Pipeline
from sluice.connectors.kafka import KafkaSource
from sluice.sinks.files import FileSink
from sluice.windows import Tumbling, count, max, sum

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


def sluice_job(kind: str, bootstrap: str, ends: dict[int, int], out: Path, args: argparse.Namespace) -> tuple[float, float]:
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
            .aggregate(count(), sum("amount"), max("amount"))
        )
    elif kind == "keyed_process":
        s = s.key_by("user").process(PerKeyWindows())
    s.sink(FileSink(str(out / "parquet"), format="parquet", compression="snappy"))
    t0, c0 = time.perf_counter(), time.process_time()
    p.run(runtime="local", restore="none")
    return time.perf_counter() - t0, time.process_time() - c0


def reference(table: pa.Table) -> pa.Table:
    """pyarrow's tumbling 1-minute count/sum/max per user over the whole input."""
    start = pc.multiply(pc.divide(table.column("ts"), WINDOW_MS), WINDOW_MS)
    t = table.append_column("window_start", start)
    return t.group_by(["user", "window_start"]).aggregate(
        [("user", "count"), ("amount", "sum"), ("amount", "max")]
    )


def check(kind: str, out: Path, expected: pa.Table) -> None:
    got = ds.dataset(str(out / "parquet"), format="parquet").to_table()
    if kind == "stateless":
        if got.num_rows != expected.num_rows:
            raise RuntimeError(f"stateless: committed {got.num_rows} rows, expected {expected.num_rows}")
        return
    ref = reference(expected)
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


def quix(bootstrap: str, n: int, out: Path) -> tuple[float, float] | None:
    """Quix Streams' seconds from its first processed event to its last, and the CPU seconds of its whole run
    (start included) on the same topic (None if it is not installed)."""
    try:
        from quixstreams import Application
        from quixstreams.dataframe.windows import Count, Max, Sum
        from quixstreams.sinks.community.file.local import LocalFileSink
    except ImportError:
        print("  quix: not installed (pip install -e '.[bench]')", flush=True)
        return None
    seen = {"n": 0, "first": 0.0, "last": 0.0}

    def processed(topic: str, partition: int, offset: int) -> None:
        seen["n"] += 1
        if seen["n"] == 1:
            seen["first"] = time.perf_counter()
        if seen["n"] == n:
            seen["last"] = time.perf_counter()

    app = Application(
        broker_address=bootstrap,
        consumer_group="quix-bench",
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
        c0 = time.process_time()
        app.run(timeout=5.0)
        cpu = time.process_time() - c0
    finally:
        os.chdir(here)
    if seen["n"] < n:
        raise RuntimeError(f"quix: processed {seen['n']} of {n} messages")
    return seen["last"] - seen["first"], cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=2_000_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--minutes", type=int, default=5)
    ap.add_argument("--parallelism", type=int, default=1)
    ap.add_argument("--backend", choices=["hashmap", "rocksdb"], default="hashmap")
    ap.add_argument("--quick", action="store_true", help="200k events over 10k keys")
    ap.add_argument("--no-dedup-join", action="store_true", help="skip benchmarks/stateful_dedup_join.py")
    args = ap.parse_args()
    if args.quick:
        args.messages, args.keys = 200_000, 10_000
    work = Path(tempfile.mkdtemp(prefix="stateful-"))
    n = args.messages
    result: dict[str, Any] = {
        k: getattr(args, k) for k in ("messages", "keys", "minutes", "parallelism", "backend")
    }
    try:
        with TansuBroker() as broker:
            table = events(n, args.keys, args.minutes)
            broker.create_topic(TOPIC, PARTITIONS)
            t0 = time.perf_counter()
            produce(broker.bootstrap, table)
            print(f"produced {n:,} events in {time.perf_counter() - t0:.1f} s", flush=True)
            ends = broker.end_offsets(TOPIC, timeout=60)
            rates: dict[str, float] = {}
            cpu_rates: dict[str, float] = {}  # events per CPU second of this process: steadier on a shared machine
            for kind in ("stateless", "window", "keyed_process"):
                secs, cpu = sluice_job(kind, broker.bootstrap, ends, work / kind, args)
                check(kind, work / kind, table)
                rates[kind], cpu_rates[kind] = n / secs, n / cpu
                print(f"  {kind:15s} {secs:7.1f} s {rates[kind]:>12,.0f} ev/s {cpu_rates[kind]:>12,.0f} ev/CPU-s",
                      flush=True)  # fmt: skip
            q = quix(broker.bootstrap, n, work / "quix")
            if q is not None:
                rates["quix"], cpu_rates["quix"] = n / q[0], n / q[1]
                print(f"  {'quix':15s} {q[0]:7.1f} s {rates['quix']:>12,.0f} ev/s {cpu_rates['quix']:>12,.0f} ev/CPU-s",
                      flush=True)  # fmt: skip
            result["rates_ev_s"] = {k: round(v) for k, v in rates.items()}
            result["cpu_rates_ev_s"] = {k: round(v) for k, v in cpu_rates.items()}
            for r, suffix in ((rates, ""), (cpu_rates, "_cpu")):
                result["window_vs_stateless" + suffix] = round(r["window"] / r["stateless"], 3)
                result["window_vs_keyed_process" + suffix] = round(r["window"] / r["keyed_process"], 2)
                result["window_vs_quix" + suffix] = round(r["window"] / r["quix"], 2) if "quix" in r else None
            print(
                f"window/stateless {result['window_vs_stateless']}, window/keyed_process "
                f"{result['window_vs_keyed_process']}, window/quix {result['window_vs_quix']}",
                flush=True,
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if not args.no_dedup_join:
        result.update(dedup_join(args.quick))
    print("RESULT " + json.dumps(result))


def dedup_join(quick: bool) -> dict[str, Any]:
    """Run benchmarks/stateful_dedup_join.py (its output passed through) and return its RESULT's ratios."""
    script = Path(__file__).with_name("stateful_dedup_join.py")
    run = subprocess.run(
        [sys.executable, str(script), *(["--quick"] if quick else [])], capture_output=True, text=True, check=True
    )
    print(run.stdout, end="", flush=True)
    found = json.loads(run.stdout.strip().splitlines()[-1].removeprefix("RESULT "))
    keys = ("dedup_vs_stateless", "join_vs_stateless", "dedup_vs_stateless_cpu", "join_vs_stateless_cpu")
    return {k: found[k] for k in keys} | {"dedup_join_events_per_s": found["events_per_s"]}


if __name__ == "__main__":
    main()
