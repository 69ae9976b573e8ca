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

The last line is ``RESULT {json}``.

Usage: python benchmarks/spark_runtime.py [--messages 1500000] [--no-standalone]
(``--as-job ...`` is how the standalone part runs this file under spark-submit.)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
from confluent_kafka import Producer
from cpu import CpuSampler  # type: ignore[import-not-found]
from kafka_ceiling import PARTITIONS, SCHEMA, TOPIC, produce, value  # type: ignore[import-not-found]

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/kafka_broker.py imports tests.*
from kafka_broker import TansuBroker
from sluice.api import Pipeline
from sluice.config import FixedDelayRestart, NoRestart
from sluice.connectors.kafka import KafkaSource
from sluice.sinks.files import FileSink

BATCH = 10_000
ROOT = Path(__file__).resolve().parent.parent


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


def run(p: Pipeline, runtime: str, out: Path, n: int, **kw: Any) -> dict[str, float]:
    t0 = time.time()
    with CpuSampler() as cpu:
        result = p.run(runtime=runtime, restore="none", **kw)
    wall = time.time() - t0
    rows = ds.dataset(str(out / "parquet"), format="parquet").count_rows()
    batches = [b for log in probes(out / "probe").values() for b in log]
    first, last = min(t for t, _ in batches), max(t for t, _ in batches)
    steady = n / (last - first)
    busy = cpu.cores_busy(first, last)
    print(
        f"  {out.name}: {result.status} after {result.attempts} attempt(s) in {wall:.1f}s; first record "
        f"{first - t0:.2f}s after run(); steady {steady:,.0f} rec/s with {busy:.2f} cores busy; {rows:,} rows",
        flush=True,
    )
    if rows != n:
        raise RuntimeError(f"{out.name}: committed {rows} rows, expected {n}")
    return {"steady": steady, "wall": n / wall, "start": first - t0, "t0": t0, "cores_busy": busy}


def restart_gap(logs: dict[str, list[tuple[float, int]]], killed_at: float | None = None) -> float:
    """First batch of a writer that began after the failure minus the failure (the killed writer's last
    batch, or ``killed_at``)."""
    if killed_at is None:  # the killed slot's log ends first among the first attempt's writers
        killed_at = min(log[-1][0] for log in logs.values())
    later = [log[0][0] for log in logs.values() if log[0][0] > killed_at]
    return min(later) - killed_at


def local_restart(bootstrap: str, ends: dict[int, int], n: int, work: Path) -> float:
    from sluice.testing.spark_faults import SlotCrash, SparkFaultInjector

    out = work / "spark_local2_restart"
    per_slot = n // 2 // BATCH  # batches each slot's source emits
    faults = SparkFaultInjector([SlotCrash("source", after=max(1, per_slot // 3), slot=1, how="kill")])
    run(build(out, 2, bootstrap, TOPIC, ends, restarts=2), "spark", out, n, faults=faults)
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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=1_500_000)
    ap.add_argument("--no-standalone", action="store_true")
    args = ap.parse_args()
    n = args.messages
    work = Path(tempfile.mkdtemp(prefix="spark-bench-"))
    figures: dict[str, dict[str, float]] = {}
    standalone: dict[str, float] = {}
    with TansuBroker() as broker:
        broker.create_topic(TOPIC, PARTITIONS)
        produce(broker.bootstrap, n)
        ends = broker.end_offsets(TOPIC, timeout=60)
        bs = broker.bootstrap
        figures["in_process_p2"] = run(build(work / "local-p2", 2, bs, TOPIC, ends), "local", work / "local-p2", n)
        from sluice.runtime.spark import spark_context

        t0 = time.perf_counter()
        spark_context(2)
        print(f"  SparkContext local[2,1] started in {time.perf_counter() - t0:.1f}s (not counted)", flush=True)
        for slots in (1, 2):
            name = f"spark_local2_{slots}slot"
            figures[name] = run(build(work / name, slots, bs, TOPIC, ends), "spark", work / name, n)
        restart = local_restart(bs, ends, n, work)
        floor = empty_stage_start(2)
        if not args.no_standalone:
            standalone = standalone_restart(broker, work)
    shutil.rmtree(work, ignore_errors=True)
    steady = {k: v["steady"] for k, v in figures.items()}
    base = steady["in_process_p2"]
    two, one = steady["spark_local2_2slot"], steady["spark_local2_1slot"]
    print(
        "RESULT "
        + json.dumps(
            {
                "messages": n,
                "source": "kafka",
                "cores": os.cpu_count(),
                "steady_rec_s": {k: round(v) for k, v in steady.items()},
                "steady_cores_busy": {k: round(v["cores_busy"], 2) for k, v in figures.items()},
                "wall_rec_s": {k: round(v["wall"]) for k, v in figures.items()},
                "spark_2slots_vs_in_process": round(two / base, 3),
                "spark_2slots_vs_1slot": round(two / one, 3),
                "start_to_first_record_s": {k: round(v["start"], 2) for k, v in figures.items()},
                "local_restart_to_first_record_s": round(restart, 2),
                "empty_barrier_stage_start_s": round(floor, 2),
                "standalone": standalone,
            }
        )
    )


if __name__ == "__main__":
    main()
