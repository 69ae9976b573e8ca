"""State backends (issue 24): a keyed job over Kafka that keeps one value per key, measured in one run.

Starts a tansu broker (tests/kafka_broker.py) and writes topics of 8-byte int64 keys: a load phase (every
key of a growing key space once: ``--keys`` keys for 1x, 10x as many for 10x) followed by updates of random
existing keys. The job (benchmarks/_state_job.py) reads a topic with ``KafkaSource`` (parallelism 1, the
local runtime, exactly-once checkpoints every second) into a keyed operator that keeps a count per key with
batch-wise state access (one multi-get and one write batch per Kafka batch). Figures come from the job's
own checkpoint statistics (per task: ``keyed_bytes`` referenced, ``keyed_persisted_bytes`` written by the
checkpoint, ``sync_s`` + ``async_s``) and metrics (the ``state_restore_s`` gauge):

* ``incremental_upload_fraction``: RocksDB incremental, median over the checkpoints after the load phase of
  bytes a checkpoint uploaded / the state it references, at 10x keys; updates are paced to 1% of the keys
  per second, one checkpoint interval (full checkpoints: 1.0);
* ``changelog_upload_fraction``: the same with changelog checkpoints (materialization every 5 s);
* ``checkpoint_growth``: median checkpoint duration (the subtask's synchronous + asynchronous part) after the
  load phase at 10x keys / at 1x, RocksDB incremental (``hashmap_checkpoint_growth``: hashmap, full);
* ``rocksdb_vs_hashmap``: throughput of the same job (unpaced, the whole 10x topic) on RocksDB / on
  hashmap; ``vs_quix``: that RocksDB throughput / Quix Streams' (``pip install 'sluice-etl[bench]'``)
  counting per message key with its own RocksDB state (and changelog topic), commits every second, over the
  same records (the whole topic). The three run in alternated rounds (``--rounds``, order rotated) after an
  untimed warm-up of each over a tenth of the topic (benchmarks/_common.py), every one timed from its start
  (``Pipeline.run``, ``Application.run``: Quix's consumer group join included) to its end (stopped after the
  last record, its final checkpoint taken); each ratio is the median of the per-round ratios by the named
  metric (``--metric``, wall time by default) with the spread and every round, CPU time of the whole process
  tree (the broker included) beside. Both sides' final counts are compared with the input's count per key;
* ``local_vs_remote_restore``: the job on checkpoint storage in S3 (a moto server in this process) with local
  recovery, restarted from its last checkpoint: restore time from the local copy / from S3 (local recovery
  off), per alternated round (``--rounds``), the median and spread;
* ``state_mb`` / ``rss_mb``: in a child process, the keyed operator keeps a 200-byte payload per key (a
  generator source writes each key once, so the data need not sit in the broker) on RocksDB with a 64 MiB
  memory budget: the last checkpoint's state size against the process's peak RSS; the hashmap backend's
  state and RSS at ``hashmap_state_target_mb`` show why it cannot run it.

The backend-level figures (the backends driven directly, benchmarks/_state_level.py) are under
``backend_*`` (``--no-backend-level`` skips them). Every target is shown with what misses beside what passes
(printed at the end and under ``targets`` in the RESULT): the upload fractions' mean beside their median, the
backend-level figure beside the job-level one. Prints the load average before and after (the machine is
shared).

    python benchmarks/state_backends.py [--quick] [--no-backend-level] [--rounds 3] [--metric wall|cpu]

The last line is ``RESULT {json}``.
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
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/kafka_broker.py imports tests.*
from _common import Timing, add_round_options, alternate, check_rounds, ratios, report, with_runs  # type: ignore[import-not-found]
from _state_job import (  # type: ignore[import-not-found]
    JobRun,
    LastCounts,
    Pacer,
    input_counts,
    keyed_stats,
    large_state_job,
    produce,
    quix_count,
    run_job,
)
from _state_level import backend_level, s3_transfer  # type: ignore[import-not-found]
from kafka_broker import TansuBroker
from sluice.state.config import StateBackendConfig

INTERVAL = 1.0


def peak_rss_mb() -> float:
    """This process's peak resident memory (VmHWM: unlike ru_maxrss, not inherited from the parent)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def topic_keys(keys: int, rounds: int, rng: np.random.Generator) -> np.ndarray:
    """Every key once (the key space growing), then ``rounds`` x 1% of the keys at random."""
    updates = rng.integers(0, keys, size=rounds * keys // 100)
    return np.concatenate([np.arange(keys), updates]).astype(np.int64)


def config(kind: str, root: str, **options: Any) -> StateBackendConfig:
    return StateBackendConfig(type=kind, incremental=True, local_dir=os.path.join(root, "local"), **options)  # type: ignore[arg-type]


def after_load(run: JobRun) -> list[dict[str, float]]:
    """Keyed figures of the checkpoints triggered a full interval after the load phase ended (so the one
    before them was after it too), the job's last one (end of input) left out."""
    assert run.load_end is not None, "paced runs only"
    picked = [keyed_stats(c) for c in run.checkpoints[:-1] if c.trigger_time > run.load_end + INTERVAL]
    if not picked:
        raise RuntimeError("no checkpoint after the load phase: make the run longer")
    return picked


def paced(bootstrap: str, topic: str, ends: dict[int, int], keys: int, kind: str, **options: Any) -> dict[str, float]:
    """The job with updates paced to 1% of ``keys`` per checkpoint interval: median upload fraction and
    checkpoint duration after the load phase."""
    with tempfile.TemporaryDirectory() as root:
        run = run_job(bootstrap, topic, ends, config(kind, root, **options), f"{root}/chk", interval=INTERVAL,
                      pace=Pacer(keys, keys / 100 / INTERVAL))  # fmt: skip
    cps = after_load(run)
    return {
        "fraction": statistics.median(c["persisted"] / c["full"] for c in cps),
        "fraction_mean": statistics.fmean(c["persisted"] / c["full"] for c in cps),
        "duration": statistics.median(c["sync_async_s"] for c in cps),
        "sync": statistics.median(c["sync_s"] for c in cps),
        "coordinator_duration": statistics.median(c["duration_s"] for c in cps),
        "state_mb": cps[-1]["full"] / (1 << 20),
        "checkpoints": len(cps),
    }


def restores(bootstrap: str, topic: str, ends: dict[int, int], rounds: int) -> dict[str, Any]:
    """The job on S3 (moto) with local recovery, then restarted ``rounds`` times with and without local
    recovery, alternated, from the last checkpoint it took while running (the restarted job has nothing left
    to read; every run keeps all checkpoints, so that one stays): every restore time (the
    ``state_restore_s`` gauge)."""
    s3, server = s3_transfer()
    try:
        options: dict[str, Any] = {"storage_options": {"endpoint_url": s3.client.meta.endpoint_url}, "num_retained": 100}
        with tempfile.TemporaryDirectory() as root:
            first = run_job(bootstrap, topic, ends, config("rocksdb", root, local_recovery=True), "s3://checkpoints/job", **options)
            state_mb = max(keyed_stats(c)["full"] for c in first.checkpoints) / (1 << 20)
            # the last checkpoint taken while the task ran (later ones reference its final state's files as
            # copies the coordinator made, of which the subtask has no local copy)
            latest = str(max((c for c in first.checkpoints if keyed_stats(c)["full"]), key=lambda c: c.checkpoint_id).path)
            # a restored job's own last checkpoint retires the local copies it does not reference: each
            # local restore starts from the local folder as the first job left it
            local = os.path.join(root, "local")
            shutil.copytree(local, f"{local}-kept", symlinks=True)
            times: dict[str, list[float]] = {"local": [], "remote": []}
            for _ in range(rounds):
                for where in times:
                    shutil.rmtree(local)
                    shutil.copytree(f"{local}-kept", local, symlinks=True)
                    run = run_job(bootstrap, topic, ends, config("rocksdb", root, local_recovery=where == "local"),
                                  "s3://checkpoints/job", interval=None, restore=latest, **options)  # fmt: skip
                    took = run.gauge("state_restore_s")
                    if took is None:
                        raise RuntimeError(f"{where} restore: no state_restore_s gauge")
                    times[where].append(took)
    finally:
        server.stop()
    return {"local": times["local"], "remote": times["remote"], "state_mb": state_mb}


def child_large_state(kind: str, target_mb: int, memory: str) -> dict[str, Any]:
    """(Child process.) The large-state job; its peak RSS."""
    with tempfile.TemporaryDirectory(dir=os.environ.get("SLUICE_BENCH_DIR")) as root:
        out = large_state_job(config(kind, root, memory=memory), target_mb, root)
    return {**out, "rss_mb": peak_rss_mb()}


def large_state(kind: str, target_mb: int, memory: str) -> dict[str, Any]:
    child = subprocess.run([sys.executable, __file__, "--large-state", kind, str(target_mb), memory],
                           capture_output=True, text=True)  # fmt: skip
    if child.returncode != 0:
        raise RuntimeError(f"large-state child ({kind}) failed: {child.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(child.stdout.strip().splitlines()[-1])
    return out


def quix_installed() -> bool:
    try:
        import quixstreams  # noqa: F401
    except ImportError:
        print("quix: not installed (pip install -e '.[bench]'): vs_quix left out", flush=True)
        return False
    return True


#: each target, and the figures that judge it: the job-level one first, then what is shown beside it
TARGETS = {
    "incremental_upload_fraction": ("<= 0.10", ["incremental_upload_fraction", "incremental_upload_fraction_mean",
                                                "backend_incremental_upload_fraction", "backend_incremental_upload_fraction_mean"]),
    "changelog_upload_fraction": ("<= 0.03", ["changelog_upload_fraction", "changelog_upload_fraction_mean",
                                              "backend_changelog_upload_fraction", "backend_changelog_upload_fraction_mean"]),
    "checkpoint_growth": ("<= 2", ["checkpoint_growth", "backend_checkpoint_growth"]),
    "rocksdb_vs_hashmap": (">= 0.5", ["rocksdb_vs_hashmap", "rocksdb_vs_hashmap_cpu", "backend_rocksdb_vs_hashmap"]),
    "vs_quix": (">= 5", ["vs_quix", "vs_quix_cpu"]),
    "local_vs_remote_restore": ("<= 0.3", ["local_vs_remote_restore", "backend_local_vs_remote_restore"]),
    "state_to_rss": (">= 4", ["state_to_rss"]),
}  # fmt: skip


def targets(result: dict[str, Any]) -> dict[str, Any]:
    """Every target with each figure that bears on it, met or not: a miss is shown beside a pass (the mean
    beside the median, the backend-level figure beside the job-level one)."""
    out: dict[str, Any] = {}
    print("targets (every figure that bears on each, misses beside passes):")
    for name, (target, keys) in TARGETS.items():
        op, bound = target.split()
        figures = {k: result[k] for k in keys if result.get(k) is not None}
        verdicts = {k: (v >= float(bound) if op == ">=" else v <= float(bound)) for k, v in figures.items()}
        out[name] = {"target": target, **{k: {"value": v, "met": verdicts[k]} for k, v in figures.items()}}
        shown = "; ".join(f"{k} {v} ({'met' if verdicts[k] else 'NOT MET'})" for k, v in figures.items())
        print(f"  {name} {target}: {shown or 'not measured'}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller sizes (under 5 minutes)")
    parser.add_argument("--keys", type=int, help="keys of the 1x topic (default 100k, quick 50k)")
    parser.add_argument("--memory", default="64 mb", help="RocksDB memory budget of the large-state run")
    parser.add_argument("--backend-level", action=argparse.BooleanOptionalAction, default=True,
                        help="also the backend-level figures, shown beside the job-level ones (default: yes)")
    parser.add_argument("--large-state", nargs=3, help=argparse.SUPPRESS)
    add_round_options(parser)
    args = parser.parse_args()
    if args.large_state:
        kind, mb, memory = args.large_state
        print(json.dumps(child_large_state(kind, int(mb), memory)))
        return
    check_rounds(args)
    load_before = os.getloadavg()
    rng = np.random.default_rng(7)
    keys = args.keys or (50_000 if args.quick else 100_000)
    rounds = 8 if args.quick else 12
    result: dict[str, Any] = {"quick": args.quick, "keys_1x": keys, "keys_10x": keys * 10, "metric": args.metric,
                              "rounds": args.rounds}  # fmt: skip

    with TansuBroker() as broker:
        ends: dict[str, dict[int, int]] = {}
        expected: dict[str, dict[int, int]] = {}
        for name, n in (("keys-1x", keys), ("keys-10x", keys * 10)):
            broker.create_topic(name, 1)
            data = topic_keys(n, rounds, rng)
            expected[name] = input_counts(data)
            took = produce(broker.bootstrap, name, data)
            ends[name] = broker.end_offsets(name, timeout=120)
            assert sum(ends[name].values()) == len(data), ends[name]
            print(f"topic {name}: {len(data):,} records ({n:,} keys, then {rounds} x 1%) produced in {took:.1f} s", flush=True)
        records_10x = sum(ends["keys-10x"].values())

        inc = {x: paced(broker.bootstrap, f"keys-{x}", ends[f"keys-{x}"], keys * m, "rocksdb") for x, m in (("1x", 1), ("10x", 10))}
        heap = {x: paced(broker.bootstrap, f"keys-{x}", ends[f"keys-{x}"], keys * m, "hashmap") for x, m in (("1x", 1), ("10x", 10))}
        log = paced(broker.bootstrap, "keys-10x", ends["keys-10x"], keys * 10, "rocksdb", changelog=True, changelog_materialize_interval="5 s")
        for name, r in [*(("rocksdb incremental " + x, v) for x, v in inc.items()), *(("hashmap " + x, v) for x, v in heap.items()),
                        ("rocksdb changelog 10x", log)]:  # fmt: skip
            print(f"{name}: upload fraction {r['fraction']:.4f} (mean {r['fraction_mean']:.4f}), checkpoint "
                  f"{r['duration'] * 1000:.0f} ms (synchronous part {r['sync'] * 1000:.0f} ms; coordinator {r['coordinator_duration'] * 1000:.0f} ms), state "
                  f"{r['state_mb']:.1f} MiB, {r['checkpoints']} checkpoints", flush=True)  # fmt: skip
        result["incremental_upload_fraction"] = round(inc["10x"]["fraction"], 4)
        result["incremental_upload_fraction_mean"] = round(inc["10x"]["fraction_mean"], 4)
        result["changelog_upload_fraction"] = round(log["fraction"], 4)
        result["changelog_upload_fraction_mean"] = round(log["fraction_mean"], 4)
        print(f"incremental_upload_fraction: median {result['incremental_upload_fraction']} beside its mean "
              f"{result['incremental_upload_fraction_mean']} (target <= 0.10: judged by the median of the checkpoints, "
              f"the mean shown beside)", flush=True)  # fmt: skip
        result["checkpoint_growth"] = round(inc["10x"]["duration"] / inc["1x"]["duration"], 2)
        result["hashmap_checkpoint_growth"] = round(heap["10x"]["duration"] / heap["1x"]["duration"], 2)
        result["checkpoint_ms"] = {f"{k}_{x}": round(r[x]["duration"] * 1000, 1) for k, r in (("rocksdb", inc), ("hashmap", heap)) for x in r}
        result["checkpoint_ms"]["rocksdb_changelog_10x"] = round(log["duration"] * 1000, 1)

        print(f"throughput over the {records_10x:,} records of keys-10x, alternated rounds:", flush=True)
        warm_ends = {p: max(1, o // 10) for p, o in ends["keys-10x"].items()}

        def throughput_run(side: str, r: int) -> Timing:
            if side == "quix":
                timing, counts = quix_count(broker.bootstrap, "keys-10x", records_10x if r else sum(warm_ends.values()))
            else:
                sink = LastCounts()
                with tempfile.TemporaryDirectory() as root:
                    run = run_job(broker.bootstrap, "keys-10x", ends["keys-10x"] if r else warm_ends, config(side, root),
                                  f"{root}/chk", interval=INTERVAL, sink=sink)  # fmt: skip
                timing, counts = Timing(run.seconds, run.cpu_seconds), sink.counts()
            if r and counts != expected["keys-10x"]:  # the warm-up reads a tenth of the topic: not compared
                wrong = sum(1 for k, c in expected["keys-10x"].items() if counts.get(k) != c)
                raise RuntimeError(f"{side}, round {r}: {wrong} of {len(expected['keys-10x'])} keys counted wrong")
            return timing

        sides = ["hashmap", "rocksdb", *(["quix"] if quix_installed() else [])]
        timings = alternate(sides, args.rounds, throughput_run, warmup=not args.no_warmup)
        work = (records_10x, records_10x)
        ratios(result, "rocksdb_vs_hashmap", timings["rocksdb"], timings["hashmap"], args.metric, ">= 0.5", work=work)
        if "quix" in timings:
            ratios(result, "vs_quix", timings["rocksdb"], timings["quix"], args.metric, ">= 5", work=work, digits=2)
        for metric, name in (("wall", "throughput_rec_s"), ("cpu", "throughput_cpu_rec_s")):  # medians over the rounds
            result[name] = {k: round(records_10x / statistics.median(t.of(metric) for t in v)) for k, v in timings.items()}
        with_runs(result, "throughput_timings_wall_cpu", timings)

        rest = restores(broker.bootstrap, "keys-10x", ends["keys-10x"], args.rounds)
        print(f"restore of {rest['state_mb']:.1f} MiB of RocksDB state: local copy "
              f"{', '.join(f'{t * 1000:.0f}' for t in rest['local'])} ms, S3 {', '.join(f'{t * 1000:.0f}' for t in rest['remote'])} ms",
              flush=True)  # fmt: skip
        report(result, "local_vs_remote_restore", [a / b for a, b in zip(rest["local"], rest["remote"], strict=True)], "<= 0.3")
        result["restore_ms"] = {"local": [round(t * 1000, 1) for t in rest["local"]], "s3": [round(t * 1000, 1) for t in rest["remote"]],
                                "state_mb": round(rest["state_mb"], 1)}  # fmt: skip

    target = 1280 if args.quick else 2048
    rocks = large_state("rocksdb", target, args.memory)
    print(f"large state, RocksDB ({args.memory} budget): {rocks['state_mb']:.0f} MiB checkpointed ({rocks['records']:,} keys) "
          f"with peak RSS {rocks['rss_mb']:.0f} MiB, {rocks['seconds']:.0f} s", flush=True)  # fmt: skip
    heap_target = target // 16
    heaps = large_state("hashmap", heap_target, args.memory)
    print(f"large state, hashmap: {heaps['state_mb']:.0f} MiB checkpointed ({heaps['records']:,} keys) with peak RSS "
          f"{heaps['rss_mb']:.0f} MiB: {heaps['rss_mb'] / max(heaps['state_mb'], 1):.1f}x its state", flush=True)  # fmt: skip
    result["state_mb"] = round(rocks["state_mb"])
    result["rss_mb"] = round(rocks["rss_mb"])
    result["state_to_rss"] = round(rocks["state_mb"] / rocks["rss_mb"], 2)
    result["memory_budget"] = args.memory
    result["hashmap_state_mb"] = round(heaps["state_mb"])
    result["hashmap_rss_mb"] = round(heaps["rss_mb"])

    if args.backend_level:
        result.update(backend_level(args.quick, rng, args.rounds, args.metric))
    result["targets"] = targets(result)
    result["loadavg"] = [round(load_before[0], 1), round(os.getloadavg()[0], 1)]
    print(f"load average {load_before[0]:.1f} -> {os.getloadavg()[0]:.1f} (2 cores, shared)")
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
