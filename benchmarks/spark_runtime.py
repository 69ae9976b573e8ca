"""Kafka -> Parquet on the Spark runtime vs in-process, and what a restart costs, in one run.

Starts a tansu broker (tests/kafka_broker.py), produces ``--messages`` ~140-byte JSON messages into 4
partitions (the data of ``kafka_ceiling.py``) and runs the same exactly-once job (``KafkaSource(format=
"json")`` -> ``FileSink(parquet)``, checkpoints every second, bounded by the end offsets):

1. **steady state**: in-process at parallelism 2, then on one embedded Spark ``local[2,1]`` with 1 slot and
   2 slots. A probe between source and sink logs the time of every batch; steady-state throughput is the
   records over the span from the first to the last batch, so stage submission, slot start-up and the
   final commit are left out (they are figures 2 and 3). Targets: Spark 2 slots >= 0.9x in-process,
   2 slots >= 1.7x 1 slot. Each run also reports how many cores the whole machine kept busy over that
   span (``benchmarks/cpu.py``): what a second slot can add is bounded by what the first left idle.
2. **start**: from ``run()`` to the first record through the probe (the context is up already), read
   against the floor Spark itself sets: an empty barrier stage of 2 tasks, from submission to a function
   that imports what a slot imports running in every task.
3. **restart on local**: 2 slots, slot 1's Python worker SIGKILLed (a lost executor's Python) a third of
   the way in; restart-to-first-record = the first batch of the new attempt minus the last batch of the
   killed slot: failure detection, cancel, stage resubmission, slot start, restore from the checkpoint,
   Kafka seek and first fetch. Target <= 3 s.
4. **restart on standalone** (``--standalone``, default on): a master and two 1-core workers on loopback
   (tests/cluster/standalone.py), the job submitted with spark-submit, one executor JVM SIGKILLed; the
   figure includes the worker relaunching the executor JVM. Recorded, no target.

The metric is named before the run (``--metric``: ``steady`` by default, the steady-state rate of figure
1; ``wall``, records over the whole run from ``run()`` to its end, and ``cpu``, records per CPU-second of the
whole process tree, JVMs and Python workers included, printed beside). The three steady-state jobs and the
restart job (figure 3) run in alternated rounds (``--rounds``, at least 3, the order rotated) after an
untimed warm-up of each (benchmarks/_common.py); ``spark_2slots_vs_in_process`` and
``spark_2slots_vs_1slot`` are the medians of the per-round ratios, the restart figure the median of the
rounds, each printed with every round and the spread. Every run's Parquet output (the restarted one
included) is read back and compared row by row with the produced messages, never counted from the job's
metrics. Figure 2's floor and figure 4 run once, after the rounds. The last line is ``RESULT {json}``.

Usage: python benchmarks/spark_runtime.py [--quick] [--messages 1500000] [--rounds 3] [--metric steady|wall|cpu]
       [--no-standalone]
(``--quick``: 300k messages, no standalone part. ``--as-job ...`` is how the standalone part runs this file
under spark-submit.)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
from confluent_kafka import Producer

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/kafka_broker.py imports tests.*
from _checks import ceiling_rows  # type: ignore[import-not-found]
from _common import (  # type: ignore[import-not-found]
    Stopwatch,
    alternate,
    load_average,
    report,
    same_table,
)
from cpu import CpuSampler  # type: ignore[import-not-found]
from kafka_broker import TansuBroker
from kafka_ceiling import PARTITIONS, SCHEMA, TOPIC, produce, value  # type: ignore[import-not-found]
from sluice.api import Pipeline
from sluice.config import FixedDelayRestart, NoRestart
from sluice.connectors.kafka import KafkaSource
from sluice.sinks.files import FileSink

BATCH = 10_000
ROOT = Path(__file__).resolve().parent.parent
SIDES = ("in_process_p2", "spark_local2_1slot", "spark_local2_2slot", "spark_local2_restart")
METRICS = ("steady", "wall", "cpu")


class Probe:
    """Logs ``time rows`` of every batch to ``<dir>/<pid>-<thread>`` (cloudpickled into slots)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        name = f"{self.directory}/{os.getpid()}-{threading.get_ident()}"
        with open(name, "a") as f:
            f.write(f"{time.time()} {batch.num_rows}\n")
        return batch


def probes(directory: Path) -> dict[str, list[tuple[float, int]]]:
    """Every probe log: {writer: [(time, rows), ...]} in time order."""
    out = {}
    for f in directory.iterdir():
        rows = [(float(t), int(n)) for t, n in (ln.split() for ln in f.read_text().splitlines() if ln)]
        out[f.name] = sorted(rows)
    return out


def build(
    out: Path, parallelism: int, bootstrap: str, topic: str, ends: dict[int, int], restarts: int = 0
) -> Pipeline:
    p = Pipeline(
        f"spark-bench-{out.name}",
        parallelism=parallelism,
        restart=FixedDelayRestart(attempts=restarts, delay=0.0) if restarts else NoRestart(),
        checkpoint={"interval": 1.0, "storage": str(out / "chk")},
    )
    src = KafkaSource(
        bootstrap,
        topic,
        format="json",
        schema=SCHEMA,
        batch_size=BATCH,
        stopping_offsets={(topic, q): off for q, off in ends.items()},
    )
    (out / "probe").mkdir(parents=True, exist_ok=True)
    s = p.source(src).map_batches(Probe(str(out / "probe")), name="probe")
    s.sink(FileSink(str(out / "parquet"), format="parquet", compression="snappy"))
    return p


def run(p: Pipeline, runtime: str, out: Path, n: int, expected: pa.Table, **kw: Any) -> dict[str, float]:
    t0 = time.time()
    with CpuSampler() as cpu, Stopwatch() as sw:
        result = p.run(runtime=runtime, restore="none", **kw)
    wall = time.time() - t0
    got = ds.dataset(str(out / "parquet"), format="parquet").to_table()
    rows = got.num_rows
    batches = [b for log in probes(out / "probe").values() for b in log]
    first, last = min(t for t, _ in batches), max(t for t, _ in batches)
    steady = n / (last - first)
    busy = cpu.cores_busy(first, last)
    print(
        f"  {out.name}: {result.status} after {result.attempts} attempt(s) in {wall:.1f}s; first record "
        f"{first - t0:.2f}s after run(); steady {steady:,.0f} rec/s with {busy:.2f} cores busy; {rows:,} rows",
        flush=True,
    )
    differs = same_table(got, expected)
    if differs is not None:
        raise RuntimeError(f"{out.name}: the Parquet output differs from the input ({differs})")
    return {"steady": steady, "wall": n / wall, "cpu": n / sw.timing.cpu, "start": first - t0, "t0": t0,
            "cores_busy": busy}


def restart_gap(logs: dict[str, list[tuple[float, int]]], killed_at: float | None = None) -> float:
    """First batch of a writer that began after the failure minus the failure (the killed writer's last
    batch, or ``killed_at``)."""
    if killed_at is None:  # the killed slot's log ends first among the first attempt's writers
        killed_at = min(log[-1][0] for log in logs.values())
    later = [log[0][0] for log in logs.values() if log[0][0] > killed_at]
    return min(later) - killed_at


def local_restart(bootstrap: str, ends: dict[int, int], n: int, out: Path, expected: pa.Table) -> float:
    from sluice.testing.spark_faults import SlotCrash, SparkFaultInjector

    per_slot = n // 2 // BATCH  # batches each slot's source emits
    faults = SparkFaultInjector([SlotCrash("source", after=max(1, per_slot // 3), slot=1, how="kill")])
    run(build(out, 2, bootstrap, TOPIC, ends, restarts=2), "spark", out, n, expected, faults=faults)
    if len(faults.fired) != 1:
        raise RuntimeError(f"the slot crash did not fire: {faults.fired}")
    gap = restart_gap(probes(out / "probe"))
    print(f"  restart to first record (local, slot killed): {gap:.2f}s", flush=True)
    return gap


def empty_stage_start(slots: int) -> float:
    """How long Spark takes from submitting a barrier stage to running an (empty) function in every task
    that imports what a slot imports: the floor under a slot's start, measured here so that figure 2 and 3
    can be read against it (a loaded machine stretches both)."""
    from sluice.runtime.spark import spark_context

    sc = spark_context(slots)

    def started(_: Any) -> Any:
        import sluice.connectors.kafka
        import sluice.runtime.spark.slot
        import sluice.sinks.files  # noqa: F401

        yield time.time()

    spans = []
    for _ in range(3):
        t0 = time.time()
        spans.append(max(sc.parallelize(range(slots), slots).barrier().mapPartitions(started).collect()) - t0)
    print(f"  empty barrier stage of {slots}, to the function in every task: {[round(s, 2) for s in spans]}s")
    return min(spans)


def standalone_restart(broker: TansuBroker, work: Path) -> dict[str, float]:
    """Submit this file as a job to a standalone cluster, SIGKILL an executor JVM once records flow, and
    time the first record of the restarted attempt. The job cannot end before the test produces the rest
    of its input, so the kill always hits a running job."""
    from cluster.standalone import StandaloneCluster

    topic, per_partition = "bench-standalone", 200_000
    cluster = StandaloneCluster(work / "standalone")
    bootstrap = broker.bootstrap
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "log_level": 0})

    def produce_half(half: int) -> None:
        for q in range(2):
            for i in range(half * per_partition // 2, (half + 1) * per_partition // 2):
                while True:
                    try:
                        producer.produce(topic, value(i), partition=q)
                        break
                    except BufferError:
                        producer.poll(0.05)
        producer.flush(120)

    try:
        t0 = time.time()
        cluster.start(workers=2)
        print(f"  standalone cluster up in {time.time() - t0:.1f}s", flush=True)
        broker.create_topic(topic, 2)
        produce_half(0)
        out = work / "standalone-job"
        (out / "probe").mkdir(parents=True)
        ends = json.dumps({0: per_partition, 1: per_partition})
        submitted = time.time()
        driver = cluster.submit("bench", __file__, "--as-job", bootstrap, topic, ends, str(out))
        while not any(len(log) >= 3 for log in probes(out / "probe").values()):
            if not driver.alive():
                raise RuntimeError(f"the job ended early:\n{driver.log_tail()}")
            time.sleep(0.1)
        first = min(log[0][0] for log in probes(out / "probe").values())
        app = cluster.app_id("bench")
        assert app is not None
        executors = cluster.executors(app)
        killed_at = time.time()
        os.kill(executors[0], signal.SIGKILL)
        before = set(probes(out / "probe"))
        while not set(probes(out / "probe")) - before:
            if not driver.alive():
                raise RuntimeError(f"the job ended:\n{driver.log_tail()}")
            time.sleep(0.1)
        produce_half(1)
        driver.popen.wait(600)
        if driver.popen.returncode != 0:
            raise RuntimeError(f"the job failed:\n{driver.log_tail()}")
        logs = probes(out / "probe")
        gap = min(log[0][0] for name, log in logs.items() if name not in before) - killed_at
        print(f"  standalone: first record {first - submitted:.1f}s after spark-submit; restart to first "
              f"record after an executor JVM kill {gap:.1f}s", flush=True)  # fmt: skip
        return {"submit_to_first_record_s": round(first - submitted, 2), "restart_to_first_record_s": round(gap, 2)}
    finally:
        orphans = cluster.stop()
        if orphans:
            print(f"  WARNING: processes left by the standalone cluster:\n{cluster.orphan_report}")


def as_job(args: list[str]) -> None:
    """The standalone part's job (run under spark-submit)."""
    bootstrap, topic, ends, out = args
    p = build(Path(out), 2, bootstrap, topic, {int(k): v for k, v in json.loads(ends).items()}, restarts=3)
    result = p.run(runtime="spark", restore="none")
    print(f"SLUICE_RESULT {result.status} {result.attempts}", flush=True)


def main() -> None:
    if sys.argv[1:2] == ["--as-job"]:
        as_job(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="300k messages, no standalone part")
    ap.add_argument("--messages", type=int, default=1_500_000)
    ap.add_argument("--no-standalone", action="store_true")
    ap.add_argument("--rounds", type=int, default=3, help="alternated rounds, at least 3 (default 3)")
    ap.add_argument("--metric", choices=METRICS, default="steady",
                    help="the metric the targets are judged by (default steady; the others printed beside)")  # fmt: skip
    ap.add_argument("--no-warmup", action="store_true", help="no untimed run of each side before the rounds")
    args = ap.parse_args()
    if args.quick:
        args.messages, args.no_standalone = 300_000, True
    if args.rounds < 3:
        raise SystemExit(f"--rounds must be at least 3 (got {args.rounds}): a median of fewer says little")
    print(f"metric: {args.metric} rate (named before the run; the others printed beside), {args.rounds} alternated "
          f"rounds, warm-up {'off' if args.no_warmup else 'on'}, load average {load_average()}", flush=True)  # fmt: skip
    n = args.messages
    res: dict[str, Any] = {"messages": n, "source": "kafka", "cores": os.cpu_count(), "metric": args.metric,
                           "rounds": args.rounds, "loadavg_before": load_average()}  # fmt: skip
    expected = ceiling_rows(n)
    work = Path(tempfile.mkdtemp(prefix="spark-bench-"))
    standalone: dict[str, float] = {}
    try:
        with TansuBroker() as broker:
            broker.create_topic(TOPIC, PARTITIONS)
            produce(broker.bootstrap, n)
            ends = broker.end_offsets(TOPIC, timeout=60)
            bs = broker.bootstrap
            from sluice.runtime.spark import spark_context

            t0 = time.perf_counter()
            spark_context(2)
            print(f"  SparkContext local[2,1] started in {time.perf_counter() - t0:.1f}s (not counted)", flush=True)

            def one(side: str, r: int) -> dict[str, float]:
                out = work / f"{side}-{r}"
                if side == "spark_local2_restart":
                    got = {"restart": local_restart(bs, ends, n, out, expected)}
                else:
                    slots = 2 if side in ("in_process_p2", "spark_local2_2slot") else 1
                    got = run(build(out, slots, bs, TOPIC, ends), "local" if side == "in_process_p2" else "spark", out,
                              n, expected)  # fmt: skip
                shutil.rmtree(out, ignore_errors=True)
                return got

            def show(f: dict[str, float]) -> str:
                if "restart" in f:
                    return f"restart to first record {f['restart']:.2f} s"
                return (f"steady {f['steady']:,.0f} rec/s, whole run {f['wall']:,.0f} rec/s, {f['cpu']:,.0f} rec/CPU-s, "
                        f"first record {f['start']:.2f} s, {f['cores_busy']:.2f} cores busy")  # fmt: skip

            figures = alternate(SIDES, args.rounds, one, warmup=not args.no_warmup, show=show)
            floor = empty_stage_start(2)
            if not args.no_standalone:
                standalone = standalone_restart(broker, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    steady = {k: figures[k] for k in SIDES[:3]}
    for m in (args.metric, *(x for x in METRICS if x != args.metric)):
        suffix = "" if m == args.metric else f"_{m}"
        for key, a, b, target in (("spark_2slots_vs_in_process", "spark_local2_2slot", "in_process_p2", ">= 0.9"),
                                  ("spark_2slots_vs_1slot", "spark_local2_2slot", "spark_local2_1slot", ">= 1.7")):  # fmt: skip
            per_round = [x[m] / y[m] for x, y in zip(steady[a], steady[b], strict=True)]
            report(res, key + suffix, per_round, target if m == args.metric else None)
    report(res, "local_restart_to_first_record_s", [f["restart"] for f in figures["spark_local2_restart"]], "<= 3", 2)
    med = lambda rs, k: statistics.median(r[k] for r in rs)  # noqa: E731
    res.update({
        "steady_rec_s": {k: round(med(v, "steady")) for k, v in steady.items()},
        "steady_rec_s_runs": {k: [round(r["steady"]) for r in v] for k, v in steady.items()},
        "steady_cores_busy": {k: round(med(v, "cores_busy"), 2) for k, v in steady.items()},
        "wall_rec_s": {k: round(med(v, "wall")) for k, v in steady.items()},
        "cpu_rec_s": {k: round(med(v, "cpu")) for k, v in steady.items()},
        "start_to_first_record_s": {k: round(med(v, "start"), 2) for k, v in steady.items()},
        "empty_barrier_stage_start_s": round(floor, 2),
        "standalone": standalone,
        "loadavg_after": load_average(),
    })  # fmt: skip
    print("RESULT " + json.dumps(res))


if __name__ == "__main__":
    main()
