"""A job that runs for long (issue 39): a steady rate through Kafka for an hour, the job killed every few
minutes and restarted as a supervisor restarts ``sluice run``; does anything grow per checkpoint?

A producer process writes JSON events at ``--rate`` per second (default 5,000; 2% of them re-sent copies of
an event from about a second earlier) into a topic of an Apache Kafka broker (tests/apache_kafka.py: a
single-node KRaft broker keeping the topic on disk; its memory is sampled but carries no target, the job's
behaviour is what is measured; tansu, memory-backed, held an hour of events but no longer answered the
final end-offset query within 10 minutes). The job (benchmarks/_endurance_job.py):
Kafka -> a raw branch to Parquet, and deduplicate(id) on RocksDB with incremental checkpoints -> 10 s
tumbling windows per key -> Parquet, both file sinks with compaction on
(``CompactionPolicy(max_checkpoints=15)``), checkpoints every 2 s, parallelism 2, local runtime. It runs as
``python -m sluice.cli run _endurance_job.py --runtime local`` (restore "latest"), is killed with SIGKILL
every ``--kill-every`` seconds and started again at once. At the end the producer stops and the job is run
once more with the topic's end offsets as stopping offsets, so it finishes and every window fires.

Sampled every ``--sample-every`` seconds: the job process's RSS (and its anonymous part, from
``/proc/<pid>/smaps_rollup``), threads and open file descriptors; the checkpoint folder's bytes and files;
the RocksDB working folders' bytes; the output's visible files; the broker's RSS. Every completed
checkpoint's end-to-end duration comes from the job's stats history. For each series the slope per hour is
a least-squares line over the samples after ``--warmup`` seconds (process series: also leaving out the first
``--settle`` seconds of each process), with a target of no growth: ``|slope| <= 5%`` of the series' median
per hour (or an absolute floor: 10 MB for RSS and storage, 1 thread, 2 fds, 10 ms of checkpoint duration).
Output files cannot be flat (the output grows with the data): their target is the rate compaction allows,
two sinks x one file per 15 checkpoints (240 an hour at 2 s), where a run without compaction writes
parallelism x two sinks per checkpoint (7,200 an hour).

The output is checked against the input, read back from the topic by a plain consumer: every produced
message (by ``seq``) once in the raw branch, and the windows equal to a reference computed from the unique
ids of the topic (count and sum of value per key and 10 s window).

The first and the restarted processes' settled RSS are reported apart: with ``--head-start 60`` the first
process starts a minute behind and catches up (as one does when the topic was filled before the job first
started); before sluice trimmed malloc's free memory (sluice.runtime.memory) that process kept ~100 MB more
for good. ``--diagnose 1`` has the job log glibc's heap figures (``<workdir>/memory.jsonl``).

    python benchmarks/endurance.py                  # an hour, a kill every 5 minutes
    python benchmarks/endurance.py --quick          # 4 minutes, a kill every 80 s: checks the machinery and
                                                    # the output; a few minutes cannot show per-hour slopes

The last line is ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import array
import collections
import json
import multiprocessing as mp
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from sluice.checkpoint.stats_log import CheckpointStatsLog  # noqa: E402
from sluice.checkpoint.storage import LocalCheckpointStorage  # noqa: E402

from tests.apache_kafka import ApacheKafkaBroker  # noqa: E402

JOB = Path(__file__).resolve().parent / "_endurance_job.py"
KEYS = 100
WINDOW_MS = 10_000
DUP_EVERY = 50  # every 50th message re-sends an earlier event
#: per series: (absolute floor of an acceptable slope per hour, unit)
FLOORS = {
    "rss_mb": 10.0, "anon_mb": 10.0, "threads": 1.0, "fds": 2.0, "checkpoint_duration_s": 0.01,
    "checkpoint_bytes_mb": 10.0, "checkpoint_files": 10.0, "rocksdb_mb": 10.0,
}  # fmt: skip


# -- the producer ------------------------------------------------------------------------------------------
def produce(bootstrap: str, topic: str, partitions: int, rate: float, stop: Any, counter: Any) -> None:
    """Produce at ``rate`` events per second until ``stop`` is set (a process of its own)."""
    from confluent_kafka import Producer

    # idempotent: a retried batch never lands behind later ones (the windows' reference assumes each
    # partition in event-time order)
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20,
                  "queue.buffering.max.messages": 1_000_000, "log_level": 0})  # fmt: skip
    errors: list[str] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    recent: collections.deque[tuple[int, int, int, int]] = collections.deque(maxlen=max(2, int(rate * 2)))
    back = max(1, int(rate))  # a copy of the event about a second earlier
    seq = next_id = 0
    tick = 0.1
    started = time.monotonic()
    while not stop.is_set():
        due = int((time.monotonic() - started) * rate)
        now = int(time.time() * 1000)
        while seq < due:
            seq += 1
            if seq % DUP_EVERY == 0 and len(recent) > back:
                eid, key, value, ts = recent[-back]
            else:
                next_id += 1
                eid, key, value, ts = next_id, next_id % KEYS, next_id % 997, now
                recent.append((eid, key, value, ts))
            msg = f'{{"seq":{seq},"id":{eid},"key":{key},"value":{value},"ts":{ts}}}'.encode()
            while True:
                try:
                    p.produce(topic, msg, partition=eid % partitions, on_delivery=delivered)
                    break
                except BufferError:
                    p.poll(0.05)
        p.poll(0)
        counter.value = seq
        time.sleep(max(0.0, tick - (time.monotonic() - started) % tick))
    if p.flush(120) != 0 or errors:
        raise SystemExit(f"producer: {len(errors)} messages not delivered: {errors[:3]}")


# -- sampling ----------------------------------------------------------------------------------------------
def proc_status(pid: int) -> dict[str, float]:
    """RSS, anonymous memory (MB), threads and fds of a process (empty if it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return {}
    fields = {line.split(":")[0]: line.split(":")[1].split() for line in status.splitlines() if ":" in line}
    roll = {line.split(":")[0]: line.split(":")[1].split() for line in rollup.splitlines()[1:] if ":" in line}
    return {
        "rss_mb": int(fields["VmRSS"][0]) / 1024,
        "anon_mb": int(roll.get("Anonymous", ["0"])[0]) / 1024,
        "threads": float(fields["Threads"][0]),
        "fds": float(fds),
    }


def folder(path: Path, visible_only: bool = False) -> tuple[float, int]:
    """(MB, files) under ``path``; ``visible_only``: files readers see (no hidden or ``_`` names)."""
    size, files = 0, 0
    for d, dirs, names in os.walk(path):
        if visible_only:
            dirs[:] = [x for x in dirs if not x.startswith((".", "_"))]
            names = [n for n in names if not n.startswith((".", "_"))]
        for n in names:
            try:
                size += os.path.getsize(os.path.join(d, n))
                files += 1
            except FileNotFoundError:
                pass
    return size / 2**20, files


class Samples:
    def __init__(self, root: Path, broker_pid: int, t0_wall: float) -> None:
        self.root = root
        self.t0_wall = t0_wall  #: the wall-clock time of t = 0 (checkpoints carry wall-clock trigger times)
        self.broker_pid = broker_pid
        self.rows: list[dict[str, float]] = []
        self.durations: dict[int, tuple[float, float]] = {}  # checkpoint id -> (trigger time, duration)
        self.stats = CheckpointStatsLog(LocalCheckpointStorage(str(root / "checkpoints"), "endurance"))

    def take(self, t: float, process: int, started: float, pid: int) -> None:
        row: dict[str, float] = {"t": t, "process": process, "age": t - started}
        row.update(proc_status(pid))
        row["checkpoint_bytes_mb"], row["checkpoint_files"] = folder(self.root / "checkpoints")
        row["rocksdb_mb"], _ = folder(self.root / "rocksdb")
        _, row["output_files"] = folder(self.root / "out", visible_only=True)
        row["broker_rss_mb"] = proc_status(self.broker_pid).get("rss_mb", 0.0)
        self.rows.append(row)
        try:
            for r in self.stats.read():
                if r.get("status") == "completed" and r.get("kind") == "checkpoint":
                    self.durations[int(r["checkpoint_id"])] = (float(r["trigger_time"]), float(r["duration_s"]))
        except Exception as exc:  # a segment replaced while read: the next sample reads it
            print(f"  (stats not read this time: {type(exc).__name__}: {exc})", flush=True)


def slope(points: list[tuple[float, float]], bin_s: float) -> float:
    """Slope per hour of a least-squares line through the medians of ``bin_s``-second bins of (seconds,
    value) points: a series that rises and falls within a bin (open files between RocksDB compactions, RSS
    between garbage collections) counts by its level, not by where a bin's edge cut it."""
    bins: dict[int, list[tuple[float, float]]] = collections.defaultdict(list)
    for t, v in points:
        bins[int(t // bin_s)].append((t, v))
    medians = [(statistics.median(t for t, _ in b), statistics.median(v for _, v in b)) for b in bins.values()]
    if len(medians) < 3:
        return float("nan")
    t = np.array([m[0] for m in medians]) / 3600.0
    y = np.array([m[1] for m in medians])
    return float(np.polyfit(t, y, 1)[0])


# -- the job -----------------------------------------------------------------------------------------------
def start_job(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "sluice.cli", "run", str(JOB), "--runtime", "local", "--restore", "latest",
           "--control-endpoint", "none", "--progress-interval", "30"]  # fmt: skip
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=str(JOB.parent))


# -- the check ---------------------------------------------------------------------------------------------
def read_topic(bootstrap: str, topic: str, ends: dict[int, int]) -> pa.Table:
    """Every message of the topic, read back by a plain consumer."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "endurance-check", "enable.auto.commit": False,
                  "log_level": 0})  # fmt: skip
    c.assign([TopicPartition(topic, p, 0) for p in ends])
    cols = {k: array.array("q") for k in ("seq", "id", "key", "value", "ts")}  # 8 bytes a value (an hour: 18M)
    left = {p: e for p, e in ends.items() if e > 0}
    deadline = time.monotonic() + 1800
    while left and time.monotonic() < deadline:
        for m in c.consume(10_000, 1.0):
            if m.error():
                continue
            e = json.loads(m.value())
            for k in cols:
                cols[k].append(e[k])
            if m.offset() + 1 >= left.get(m.partition(), 0):
                left.pop(m.partition(), None)
    c.close()
    if left:
        raise RuntimeError(f"could not read the topic back: partitions {sorted(left)} short")
    return pa.table({k: pa.array(np.frombuffer(v, dtype=np.int64)) for k, v in cols.items()})


def check_output(root: Path, produced: pa.Table) -> dict[str, Any]:
    raw = ds.dataset(str(root / "out" / "raw"), format="parquet").to_table(columns=["seq"])
    seqs = np.sort(raw.column("seq").to_numpy())
    want = np.sort(produced.column("seq").to_numpy())
    raw_once = bool(len(seqs) == len(want) and np.array_equal(seqs, want))
    # the reference windows: unique ids of the topic (copies carry the original's fields)
    ids = produced.column("id").to_numpy()
    _, first = np.unique(ids, return_index=True)
    unique = produced.take(pa.array(first))
    start = pa.array(unique.column("ts").to_numpy() // WINDOW_MS * WINDOW_MS)
    ref = (
        pa.table({"key": unique.column("key"), "window_start": start, "value": unique.column("value")})
        .group_by(["key", "window_start"])
        .aggregate([("value", "count"), ("value", "sum")])
    )
    ref_rows = sorted(zip(*(ref.column(c).to_pylist() for c in ("key", "window_start", "value_count", "value_sum")), strict=True))
    got = ds.dataset(str(root / "out" / "windows"), format="parquet").to_table()
    got_rows = sorted(zip(*(got.column(c).to_pylist() for c in ("key", "window_start", "count", "sum_value")), strict=True))
    dup_windows = len(got_rows) - len(set(got_rows))
    return {
        "events": len(want),
        "unique_ids": len(unique),
        "raw_rows": len(seqs),
        "raw_every_message_once": raw_once,
        "windows": len(ref_rows),
        "windows_output": len(got_rows),
        "windows_duplicated": dup_windows,
        "windows_equal_reference": got_rows == ref_rows,
        "windows_missing": len(set(ref_rows) - set(got_rows)),
        "windows_unexpected": len(set(got_rows) - set(ref_rows)),
    }


# -- the report --------------------------------------------------------------------------------------------
def series(samples: Samples, warmup: float, settle: float, end: float, bin_s: float) -> dict[str, dict[str, Any]]:
    """Each series' median and slope per hour between ``warmup`` and ``end`` (the final run left out)."""
    out: dict[str, dict[str, Any]] = {}
    steady = [r for r in samples.rows if warmup <= r["t"] <= end]
    for name, floor in FLOORS.items():
        if name == "checkpoint_duration_s":
            pts = [(trig - samples.t0_wall, d) for trig, d in samples.durations.values()
                   if warmup <= trig - samples.t0_wall <= end]  # fmt: skip
        elif name in ("rss_mb", "anon_mb", "threads", "fds"):
            pts = [(r["t"], r[name]) for r in steady if name in r and r["age"] >= settle]
        else:
            pts = [(r["t"], r[name]) for r in steady if name in r]
        values = [v for _, v in pts]
        median = statistics.median(values) if values else float("nan")
        s = slope(pts, bin_s)
        limit = max(floor, 0.05 * abs(median)) if values else float("nan")
        out[name] = {"slope_per_hour": round(s, 4), "median": round(median, 4), "limit_per_hour": round(limit, 4),
                     "flat": bool(abs(s) <= limit), "points": len(pts)}  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="4 minutes, a kill every 80 s, warm-up 60 s")
    ap.add_argument("--duration", type=float, default=3600.0, help="seconds of production (default 3600)")
    ap.add_argument("--kill-every", type=float, default=300.0, help="seconds between kills (default 300)")
    ap.add_argument("--warmup", type=float, default=300.0, help="seconds left out of the slopes (default 300)")
    ap.add_argument("--settle", type=float, default=60.0, help="seconds of each process left out (default 60)")
    ap.add_argument("--rate", type=float, default=5000.0, help="events per second (default 5000)")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--interval", type=float, default=2.0, help="checkpoint interval (default 2 s)")
    ap.add_argument("--sample-every", type=float, default=5.0)
    ap.add_argument("--bin", type=float, default=None,
                    help="seconds per bin whose median the slopes are fitted through (default: --kill-every)")
    ap.add_argument("--head-start", type=float, default=0.0,
                    help="seconds the producer runs before the first job process starts (a backlog it catches up)")
    ap.add_argument("--workdir", default=None, help="keep everything here (default: a temporary folder)")
    ap.add_argument("--diagnose", type=int, default=0, choices=[0, 1, 2],
                    help="the job logs glibc's heap (1) and Python's top allocations (2) to <workdir>/memory.jsonl")
    args = ap.parse_args()
    if args.quick:
        args.duration, args.kill_every, args.warmup, args.settle = 240.0, 80.0, 60.0, 20.0
    args.bin = args.bin or min(args.kill_every, args.duration / 6)
    load_before = os.getloadavg()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="sluice-endurance-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        result = run(args, work)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    result["load_before"] = [round(x, 2) for x in load_before]
    result["load_after"] = [round(x, 2) for x in os.getloadavg()]
    print("RESULT " + json.dumps(result))


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    topic = "endurance"
    with ApacheKafkaBroker() as broker:
        broker.create_topic(topic, args.partitions)
        env = {**os.environ, "ENDURANCE_BOOTSTRAP": broker.bootstrap, "ENDURANCE_TOPIC": topic,
               "ENDURANCE_ROOT": str(work), "ENDURANCE_PARALLELISM": str(args.parallelism),
               "ENDURANCE_INTERVAL": str(args.interval)}  # fmt: skip
        if args.diagnose:
            env["ENDURANCE_DIAGNOSE"] = str(args.diagnose)
        ctx = mp.get_context("spawn")
        stop, counter = ctx.Event(), ctx.Value("q", 0)
        producer = ctx.Process(
            target=produce, args=(broker.bootstrap, topic, args.partitions, args.rate, stop, counter), daemon=True
        )
        t0_wall = time.time()
        t0 = time.monotonic()
        samples = Samples(work, broker._proc.pid, t0_wall)  # type: ignore[attr-defined]
        producer.start()
        while counter.value < args.head_start * args.rate:  # the first process starts behind by this much
            time.sleep(0.2)
        processes: list[dict[str, Any]] = []
        log = work / "job.log"
        job = start_job(env, log)
        processes.append({"pid": job.pid, "started": 0.0})
        next_kill = args.kill_every
        next_sample = 0.0
        while (now := time.monotonic() - t0) < args.duration:
            if job.poll() is not None:
                raise RuntimeError(f"the job ended by itself (exit {job.returncode}); see {log}")
            if now >= next_kill:
                job.send_signal(signal.SIGKILL)
                job.wait()
                processes[-1]["ended"] = now
                job = start_job(env, log)
                processes.append({"pid": job.pid, "started": time.monotonic() - t0})
                print(f"{now:7.0f}s  killed the job; process {len(processes)} started", flush=True)
                next_kill += args.kill_every
            if now >= next_sample:
                samples.take(now, len(processes) - 1, processes[-1]["started"], job.pid)
                r = samples.rows[-1]
                print(f"{now:7.0f}s  p{len(processes)} rss {r.get('rss_mb', 0):6.0f} MB  threads {r.get('threads', 0):3.0f}  "
                      f"fds {r.get('fds', 0):4.0f}  chk {r['checkpoint_bytes_mb']:6.1f} MB/{r['checkpoint_files']:4.0f} files  "
                      f"out {r['output_files']:5.0f} files  produced {counter.value}", flush=True)  # fmt: skip
                next_sample += args.sample_every
            time.sleep(0.2)
        stop.set()
        producer.join(300)
        if producer.exitcode != 0:
            raise RuntimeError(f"the producer failed (exit {producer.exitcode})")
        produced_at_end = time.monotonic() - t0
        job.send_signal(signal.SIGKILL)
        job.wait()
        processes[-1]["ended"] = produced_at_end
        # the figures of the run, before the final run and the check (which take a while): kept if they fail
        with open(work / "samples.json", "w") as f:
            json.dump({"rows": samples.rows, "durations": samples.durations, "processes": processes}, f)
        figures = series(samples, args.warmup, args.settle, produced_at_end, args.bin)
        settled = process_memory(samples, processes, args.settle)
        outputs = [(r["t"], r["output_files"]) for r in samples.rows if args.warmup <= r["t"] <= produced_at_end]
        files_per_hour = slope(outputs, args.bin)
        allowed = 2 * 3600 / (15 * args.interval)
        without = args.parallelism * 2 * 3600 / args.interval
        report(figures, settled, files_per_hour, allowed, without)
        # the last process: read up to the end, then finish (every window fires); a broker holding an hour of
        # events in memory answers slowly
        ends = broker.end_offsets(topic, timeout=600)
        final = start_job({**env, "ENDURANCE_STOP_AT": json.dumps(ends)}, log)
        processes.append({"pid": final.pid, "started": time.monotonic() - t0, "final": True})
        try:
            final.wait(1800)
        except subprocess.TimeoutExpired:
            final.kill()
            raise RuntimeError(f"the final run did not finish in 30 minutes; see {log}") from None
        if final.returncode != 0:
            raise RuntimeError(f"the final run failed (exit {final.returncode}); see {log}")
        samples.take(time.monotonic() - t0, len(processes) - 1, processes[-1]["started"], final.pid)
        produced = read_topic(broker.bootstrap, topic, ends)
        broker_rss = max(r.get("broker_rss_mb", 0.0) for r in samples.rows)
    checked = check_output(work, produced)
    print(f"output: {json.dumps(checked)}")
    return {
        "duration_s": round(produced_at_end, 1),
        "rate": args.rate,
        "kills": len(processes) - 2,
        "processes": len(processes),
        "checkpoints_completed": len(samples.durations),
        **{f"{k}_slope_per_hour": v["slope_per_hour"] for k, v in figures.items()},
        **{f"{k}_median": v["median"] for k, v in figures.items()},
        **{f"{k}_flat": v["flat"] for k, v in figures.items()},
        "output_files_per_hour": round(files_per_hour, 1),
        "output_files_per_hour_allowed": round(allowed, 1),
        "output_files_per_hour_without_compaction": round(without, 1),
        "output_files_bounded": bool(files_per_hour <= 1.5 * allowed),
        "first_process_rss_mb": settled["first_rss_mb"],
        "restarted_rss_mb": settled["restarted_rss_mb"],
        "first_process_anon_mb": settled["first_anon_mb"],
        "restarted_anon_mb": settled["restarted_anon_mb"],
        "broker_rss_mb_max": round(broker_rss, 1),
        # folders of killed processes are deleted by the next one; the last run ended cleanly: none left
        "rocksdb_folders_left": len(os.listdir(work / "rocksdb")) if (work / "rocksdb").exists() else 0,
        **checked,
        "output_exact": bool(checked["raw_every_message_once"] and checked["windows_equal_reference"]),
        "all_flat": all(v["flat"] for v in figures.values()) and files_per_hour <= 1.5 * allowed,
    }


def process_memory(samples: Samples, processes: list[dict[str, Any]], settle: float) -> dict[str, Any]:
    """The settled RSS and anonymous memory of each process (median after ``settle`` s): the first one
    against the restarted ones (the final, bounded run left out)."""
    per: dict[int, list[dict[str, float]]] = collections.defaultdict(list)
    for r in samples.rows:
        if r["age"] >= settle and "rss_mb" in r and not processes[int(r["process"])].get("final"):
            per[int(r["process"])].append(r)

    def med(i: int, key: str) -> float:
        return round(statistics.median(r[key] for r in per[i]), 1) if per.get(i) else float("nan")

    restarted = [i for i in per if i > 0]
    return {
        "first_rss_mb": med(0, "rss_mb"),
        "first_anon_mb": med(0, "anon_mb"),
        "restarted_rss_mb": [med(i, "rss_mb") for i in sorted(restarted)],
        "restarted_anon_mb": [med(i, "anon_mb") for i in sorted(restarted)],
    }


def report(
    figures: dict[str, dict[str, Any]], settled: dict[str, Any], files_per_hour: float, allowed: float,
    without: float,
) -> None:  # fmt: skip
    print("\nseries after warm-up: slope per hour (target |slope| <= limit)")
    for name, f in figures.items():
        print(f"  {name:22} median {f['median']:10.3f}  slope {f['slope_per_hour']:+10.3f}/h  "
              f"limit {f['limit_per_hour']:8.3f}  {'flat' if f['flat'] else 'GROWS'}  ({f['points']} points)")  # fmt: skip
    print(f"  output files           {files_per_hour:+10.1f}/h (compaction allows {allowed:.0f}/h; without it "
          f"{without:.0f}/h)")  # fmt: skip
    print(f"first process settled at {settled['first_rss_mb']} MB RSS ({settled['first_anon_mb']} MB anonymous); "
          f"restarted ones {settled['restarted_rss_mb']} ({settled['restarted_anon_mb']})", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
