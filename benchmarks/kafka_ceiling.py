"""Kafka -> Parquet: sluice with exactly-once checkpoints against the fastest raw loop (the ceiling).

Starts a tansu broker (tests/kafka_broker.py), produces ``--messages`` JSON messages of ~140 bytes into
``--partitions`` partitions (4), then measures, on the same topic:

(a) ceiling: one tuned confluent-kafka consumer, ``consume()`` in batches, ``pyarrow.json`` over the joined
    values, a ``ParquetWriter`` -- no checkpoints, no guarantees;
(b) sluice: ``KafkaSource(format="json")`` -> ``FileSink(parquet)`` on the local runtime with exactly-once
    checkpoints every second, bounded by the end offsets, at each ``--parallelism`` (default 1 and 2);
(c) with parallelism 2: two ceiling loops at once in two processes, two partitions each, which share
    nothing: what two consumers can get from this broker on this machine at all;
(d) with parallelism 2: the same two loops as two threads of one process: what two consumers get in one
    process, where they share the GIL (confluent-kafka builds a Python ``Message`` per record with it held);
(e) with parallelism 2, a design probe: two child processes consume and parse (a ceiling loop without its
    writer) and send each Arrow batch over a pipe (Arrow IPC) to one process that writes both Parquet
    files in two threads: what readers that fetch in a process of their own could reach.

(b) runs on each of the source's readers (``--readers``, default both): ``native`` fetches and decodes
    into Arrow without the GIL (sluice.connectors.kafka.native_reader), ``python`` is confluent-kafka.
    (d) and (e) run with ``--probes``.

Targets (issue 37), each the median over the rounds of a same-round ratio: ``native_p1_vs_ceiling`` >= 2.0
(sluice on the native reader at parallelism 1 over the one-loop ceiling), ``native_p2_vs_two_processes``
>= 0.9 (parallelism 2 in one process over (c)), and on a machine with >= 8 cores ``native_p8_vs_p1`` >= 5
(``--partitions 16 --parallelism 1 2 8``); the python reader's figures are printed beside. Each run also
prints how many cores the whole machine kept busy over it (``benchmarks/cpu.py``). On a shared machine the
load changes within a run, so ``--repeat N`` measures the ceiling, (c), then sluice at each reader and
parallelism, N times in turn (the readers' order alternates between rounds), after an untimed warm-up of
each side over a tenth of the topic; every output is counted against the input (Parquet row counts). The last line is ``RESULT {json}`` with, for each ratio, its
median, ``<key>_runs`` (every round) and ``<key>_spread`` (min, max), the rounds' rates and load averages.
Beside wall time, each run's CPU time per record (this process and its children; the broker's apart) is
printed, and ``<reader>_p<n>_cpu_vs_ceiling`` (the ceiling's CPU per record over the job's): on a loaded
machine a job of several threads gets a larger share of the cores than the one-thread ceiling, which
flatters its wall-time ratio; the CPU ratio does not move with the load.

Usage: python benchmarks/kafka_ceiling.py [--messages 2000000] [--partitions 4] [--parallelism 1 2]
    [--readers native python] [--repeat 3] [--probes] [--no-fetch-thread]
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from multiprocessing.pool import ThreadPool
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.json as pjson
import pyarrow.parquet as pq
from confluent_kafka import Consumer, Producer, TopicPartition
from cpu import CpuSampler  # type: ignore[import-not-found]

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/kafka_broker.py imports tests.*
from kafka_broker import TansuBroker
from sluice.api import Pipeline
from sluice.config import NoRestart
from sluice.connectors.kafka import KafkaSource
from sluice.connectors.kafka.config import TUNING

SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("ts", pa.int64()),
        ("user", pa.string()),
        ("event", pa.string()),
        ("amount", pa.float64()),
        ("payload", pa.string()),
    ]
)
PARTITIONS = 4
#: the partitions of each of the two loops in (c), (d) and (e)
HALVES = (list(range(PARTITIONS // 2)), list(range(PARTITIONS // 2, PARTITIONS)))
TOPIC = "bench"


def value(i: int) -> bytes:
    """A ~140-byte JSON record."""
    return (
        b'{"id": %d, "ts": %d, "user": "user-%06d", "event": "click", "amount": %d.25, '
        b'"payload": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}' % (i, 1_700_000_000_000 + i, i % 100_000, i % 1000)
    )


def produce(bootstrap: str, n: int) -> None:
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.num.messages": 10_000,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 2_000_000,
            "queue.buffering.max.kbytes": 2_097_151,
            "compression.type": "none",
            "log_level": 0,
        }
    )
    t0 = time.perf_counter()
    for i in range(n):
        while True:
            try:
                p.produce(TOPIC, value(i), partition=i % PARTITIONS)
                break
            except BufferError:
                p.poll(0.05)
        if i % 500_000 == 0 and i:
            print(f"  produced {i:,}", flush=True)
    if p.flush(300) != 0:
        raise RuntimeError("messages not delivered")
    print(f"produced {n:,} x ~{len(value(n))} B in {time.perf_counter() - t0:.1f}s", flush=True)


def ceiling(bootstrap: str, n: int, out: Path, partitions: Sequence[int] = range(PARTITIONS)) -> float:
    """The fastest loop we could write: batch consume, one JSON parse per batch, one Parquet file."""
    return n / _ceiling_span(bootstrap, n, out, partitions)[2]


def _ceiling_consumer(bootstrap: str, partitions: Sequence[int]) -> Consumer:
    """A tuned consumer assigned ``partitions`` from their start."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "ceiling",
            "enable.auto.commit": False,
            "log_level": 0,
            **{k: v for k, v in TUNING.items() if k != "isolation.level"},
        }
    )
    c.assign([TopicPartition(TOPIC, p, 0) for p in partitions])
    return c


def _ceiling_tables(c: Consumer, n: int) -> Iterator[pa.Table]:
    """The ceiling loop's reading half: batch consume, one JSON parse per batch, until ``n`` records."""
    parse = pjson.ParseOptions(explicit_schema=SCHEMA)
    read = pjson.ReadOptions(block_size=1 << 22)
    got = 0
    while got < n:
        msgs = c.consume(10_000, 0.05)
        if not msgs:
            continue
        values = [m.value() for m in msgs]
        yield pjson.read_json(io.BytesIO(b"\n".join(values)), read_options=read, parse_options=parse)
        got += len(values)


def _ceiling_span(bootstrap: str, n: int, out: Path, partitions: Sequence[int]) -> tuple[float, float, float]:
    """The ceiling loop over ``partitions`` until ``n`` records: (wall start, wall end, seconds)."""
    c = _ceiling_consumer(bootstrap, partitions)
    t0 = time.perf_counter()
    start = time.time()
    with pq.ParquetWriter(out / f"ceiling-{min(partitions)}.parquet", SCHEMA, compression="snappy") as w:
        for table in _ceiling_tables(c, n):
            w.write_table(table)
    dt = time.perf_counter() - t0
    c.close()
    return start, time.time(), dt


def two_ceilings(bootstrap: str, ends: dict[int, int], out: Path, *, threads: bool = False) -> float:
    """Two ceiling loops at once, half the partitions each: in two processes, what two consumers that share
    nothing get from this broker on this machine (the most a parallelism-2 job could reach); with
    ``threads``, in two threads of this process (the most two readers sharing one GIL could reach)."""
    jobs = [(bootstrap, sum(ends[p] for p in h), out, h) for h in HALVES]
    pool = ThreadPool(2) if threads else multiprocessing.get_context("spawn").Pool(2)
    with pool:
        spans = pool.starmap(_ceiling_span, jobs)
    return sum(ends.values()) / (max(e for _, e, _ in spans) - min(s for s, _, _ in spans))


def _fetch_child(bootstrap: str, n: int, partitions: Sequence[int], conn: Any) -> None:
    """(e)'s child: the ceiling loop's consume and parse, each table sent as one Arrow IPC stream."""
    c = _ceiling_consumer(bootstrap, partitions)
    for table in _ceiling_tables(c, n):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, SCHEMA) as w:
            w.write_table(table)
        conn.send_bytes(sink.getvalue())
    conn.send_bytes(b"")
    c.close()


def fetch_processes(bootstrap: str, ends: dict[int, int], out: Path) -> float:
    """(e): two fetching child processes, one writing process (this one, a thread per child)."""
    ctx = multiprocessing.get_context("spawn")

    def write(conn: Any, name: str) -> None:
        with pq.ParquetWriter(out / name, SCHEMA, compression="snappy") as w:
            while buf := conn.recv_bytes():
                w.write_table(pa.ipc.open_stream(buf).read_all())

    t0 = time.perf_counter()
    children = []
    for h in HALVES:
        mine, theirs = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_fetch_child, args=(bootstrap, sum(ends[p] for p in h), h, theirs))
        proc.start()
        theirs.close()
        children.append((proc, mine, f"probe-{min(h)}.parquet"))
    with ThreadPool(2) as pool:
        pool.starmap(write, [(conn, name) for _, conn, name in children])
    dt = time.perf_counter() - t0
    for proc, _, _ in children:
        proc.join()
    return sum(ends.values()) / dt


def _file_sink(directory: str) -> Any:
    """The real exactly-once FileSink (sluice.sinks.files), Parquet with the ceiling's compression."""
    from sluice.sinks.files import FileSink

    return FileSink(directory, format="parquet", compression="snappy")


def sluice_job(
    bootstrap: str,
    n: int,
    out: Path,
    ends: dict[int, int],
    parallelism: int,
    fetch_thread: bool = True,
    reader: str = "auto",
) -> float:
    p = Pipeline(
        "kafka-bench",
        parallelism=parallelism,
        restart=NoRestart(),
        checkpoint={"interval": 1.0, "storage": str(out / "chk"), "mode": "exactly_once"},
    )
    src = KafkaSource(
        bootstrap,
        TOPIC,
        format="json",
        schema=SCHEMA,
        batch_size=10_000,
        stopping_offsets={(TOPIC, q): off for q, off in ends.items()},
        commit_offsets_on_checkpoint=True,
        fetch_thread=fetch_thread,
        reader=reader,
    )
    p.source(src).sink(_file_sink(str(out / "parquet")))
    t0 = time.perf_counter()
    result = p.run(runtime="local", restore="none")
    dt = time.perf_counter() - t0
    rows = _rows(out / "parquet")
    print(
        f"  sluice: {result.status}, {result.checkpoint_counts.completed} "
        f"checkpoints, {rows:,} rows committed",
        flush=True,
    )
    if rows != n:
        raise RuntimeError(f"sluice committed {rows} rows, expected {n}")
    return n / dt


def _ratios(runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """``key``'s median over the rounds, every round's value and the spread."""
    vals = [r[key] for r in runs if key in r]
    if not vals:
        return {}
    return {
        key: round(statistics.median(vals), 3),
        f"{key}_runs": vals,
        f"{key}_spread": [min(vals), max(vals)],
    }


class CpuTime:
    """CPU seconds of this process, its reaped children (the two-process loops) and the broker over a span:
    a figure the machine's other load does not change the way it changes wall time."""

    def __init__(self, broker_pid: int | None) -> None:
        self.broker_pid = broker_pid

    def _now(self) -> tuple[float, float]:
        me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        broker = 0.0
        if self.broker_pid is not None:
            with open(f"/proc/{self.broker_pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            broker = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime, broker

    def __enter__(self) -> CpuTime:
        self._start = self._now()
        return self

    def __exit__(self, *exc: object) -> None:
        end = self._now()
        self.process_s, self.broker_s = end[0] - self._start[0], end[1] - self._start[1]


def _rows(directory: Path) -> int:
    return sum(
        pq.ParquetFile(os.path.join(d, f)).metadata.num_rows
        for d, _, fs in os.walk(directory)
        for f in fs
        if f.endswith(".parquet")
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=2_000_000)
    ap.add_argument(
        "--partitions", type=int, default=4, help="partitions of the topic (>= the largest parallelism)"
    )
    ap.add_argument(
        "--parallelism", "--parallelism-list", dest="parallelism", type=int, nargs="+", default=[1, 2],
        help="sluice source parallelism(s), e.g. 1 2 8",
    )  # fmt: skip
    ap.add_argument(
        "--readers", nargs="+", default=["native", "python"], choices=["native", "python"],
        help="the Kafka source's readers to measure (native: fetch and decoding without the GIL)",
    )  # fmt: skip
    ap.add_argument("--repeat", type=int, default=3, help="rounds of ceiling + sluice runs, in turn")
    ap.add_argument(
        "--probes", action="store_true", help="also (d) two loops as threads and (e) fetch processes"
    )
    ap.add_argument("--no-fetch-thread", action="store_true", help="consume in poll_next (the old reader)")
    args = ap.parse_args()
    global PARTITIONS, HALVES
    PARTITIONS = args.partitions
    HALVES = (list(range(PARTITIONS // 2)), list(range(PARTITIONS // 2, PARTITIONS)))
    if max(args.parallelism) > PARTITIONS:
        ap.error(f"--partitions ({PARTITIONS}) must be >= the largest parallelism ({max(args.parallelism)})")
    # what a job imports the first time it runs (the control endpoint's aiohttp, the sink, the native
    # extension): imported here, so round 1's first job does not pay the process's start-up
    import sluice.connectors.kafka.native_reader
    import sluice.control.server
    import sluice.sinks.files  # noqa: F401

    work = Path(tempfile.mkdtemp(prefix="kafka-bench-"))
    rounds: list[dict[str, Any]] = []
    load_before = os.getloadavg()[0]
    print(f"{os.cpu_count()} cores, load average {load_before:.1f}", flush=True)
    try:
        with TansuBroker() as broker:
            proc = getattr(broker, "_proc", None)
            pid = proc.pid if proc is not None else None
            broker.create_topic(TOPIC, PARTITIONS)
            produce(broker.bootstrap, args.messages)
            ends = broker.end_offsets(TOPIC, timeout=60)
            assert sum(ends.values()) == args.messages, ends
            # an untimed warm-up of each side over a tenth of the topic (first records of each partition)
            warm_ends = {q: max(1, off // 10) for q, off in ends.items()}
            warm_n = sum(warm_ends.values())
            (work / "warm").mkdir()
            ceiling(broker.bootstrap, warm_n, work / "warm")
            for reader in args.readers:
                sluice_job(broker.bootstrap, warm_n, work / f"warm-{reader}", warm_ends, 1, True, reader)
            shutil.rmtree(work / "warm", ignore_errors=True)
            print("warm-up done", flush=True)
            for rnd in range(args.repeat):
                row: dict[str, Any] = {"round": rnd + 1, "loadavg": round(os.getloadavg()[0], 1)}
                cdir = work / f"ceiling-{rnd}"
                cdir.mkdir()
                with CpuSampler() as cpu, CpuTime(pid) as ct:
                    c_rate = ceiling(broker.bootstrap, args.messages, cdir)
                if _rows(cdir) != args.messages:
                    raise RuntimeError(f"the ceiling wrote {_rows(cdir)} rows, expected {args.messages}")
                shutil.rmtree(cdir)
                row["ceiling_rec_s"] = round(c_rate)
                row["ceiling_cpu_ns_per_rec"] = round(ct.process_s / args.messages * 1e9)
                row["broker_cpu_ns_per_rec"] = round(ct.broker_s / args.messages * 1e9)
                print(
                    f"(a) round {rnd + 1}: ceiling {c_rate:,.0f} rec/s, {cpu.cores_busy(0, float('inf')):.2f} cores busy",
                    flush=True,
                )
                if 2 in args.parallelism:
                    cdir.mkdir()
                    pair = two_ceilings(broker.bootstrap, ends, cdir)
                    if _rows(cdir) != args.messages:
                        raise RuntimeError(
                            f"the two loops wrote {_rows(cdir)} rows, expected {args.messages}"
                        )
                    shutil.rmtree(cdir)
                    row["two_processes_rec_s"] = round(pair)
                    print(
                        f"(c) round {rnd + 1}: two ceiling loops in two processes: {pair:,.0f} rec/s = {pair / c_rate:.2f}x one loop",
                        flush=True,
                    )
                    if args.probes:
                        cdir.mkdir()
                        thread_pair = two_ceilings(broker.bootstrap, ends, cdir, threads=True)
                        probe = fetch_processes(broker.bootstrap, ends, cdir)
                        shutil.rmtree(cdir)
                        row["two_threads_ratio"] = round(thread_pair / c_rate, 3)
                        row["fetch_processes_ratio"] = round(probe / c_rate, 3)
                        print(
                            f"(d) two loops as threads {thread_pair / c_rate:.2f}x; (e) fetch processes {probe / c_rate:.2f}x",
                            flush=True,
                        )
                readers = (
                    args.readers if rnd % 2 == 0 else list(reversed(args.readers))
                )  # alternate who goes first
                for reader in readers:
                    for par in args.parallelism:
                        out = work / f"sluice-{rnd}-{reader}-{par}"
                        with CpuSampler() as cpu, CpuTime(pid) as ct:
                            s_rate = sluice_job(
                                broker.bootstrap,
                                args.messages,
                                out,
                                ends,
                                par,
                                not args.no_fetch_thread,
                                reader,
                            )
                        busy = cpu.cores_busy(0, float("inf"))
                        shutil.rmtree(out, ignore_errors=True)
                        row[f"{reader}_p{par}_rec_s"] = round(s_rate)
                        row[f"{reader}_p{par}_cores_busy"] = round(busy, 2)
                        row[f"{reader}_p{par}_vs_ceiling"] = round(s_rate / c_rate, 3)
                        cpu_ns = ct.process_s / args.messages * 1e9
                        row[f"{reader}_p{par}_cpu_ns_per_rec"] = round(cpu_ns)
                        # the ceiling's CPU per record over this job's: > 1 is less CPU than the ceiling
                        row[f"{reader}_p{par}_cpu_vs_ceiling"] = round(row["ceiling_cpu_ns_per_rec"] / cpu_ns, 3)
                        if par == 2 and "two_processes_rec_s" in row:
                            row[f"{reader}_p2_vs_two_processes"] = round(
                                s_rate / row["two_processes_rec_s"], 3
                            )
                        if par > 1 and f"{reader}_p1_rec_s" in row:
                            row[f"{reader}_p{par}_vs_p1"] = round(s_rate / row[f"{reader}_p1_rec_s"], 3)
                        print(
                            f"(b) round {rnd + 1}: sluice exactly-once, {reader} reader, parallelism {par}: "
                            f"{s_rate:,.0f} rec/s = {s_rate / c_rate:.2f}x the ceiling, {busy:.2f} cores busy, "
                            f"{cpu_ns:,.0f} ns CPU per record (the ceiling {row['ceiling_cpu_ns_per_rec']:,})",
                            flush=True,
                        )
                rounds.append(row)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result: dict[str, Any] = {
        "messages": args.messages,
        "partitions": PARTITIONS,
        "cores": os.cpu_count(),
        "fetch_thread": not args.no_fetch_thread,
        "ceiling_rec_s": round(statistics.median(r["ceiling_rec_s"] for r in rounds)),
    }
    for reader in args.readers:
        for par in args.parallelism:
            result.update(_ratios(rounds, f"{reader}_p{par}_vs_ceiling"))
            result.update(_ratios(rounds, f"{reader}_p{par}_cpu_vs_ceiling"))
            if par > 1:
                result.update(_ratios(rounds, f"{reader}_p{par}_vs_p1"))
        result.update(_ratios(rounds, f"{reader}_p2_vs_two_processes"))
    result["rounds"] = rounds
    result["loadavg"] = [round(load_before, 1), round(os.getloadavg()[0], 1)]
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
