"""benchmarks/peers.py's latency rounds: produce timestamp -> record visible in the output, for one job.

The job starts on an empty topic; a record every 0.1 s primes it until its first output is visible (its
consumer assigned, its first checkpoint committed); then ``--latency-rate`` records/s for
``--latency-seconds``, each carrying the time it was produced (``ts``, ms). A record's latency is the time
its file, or the consumer batch that read it, was first seen by the watcher (polled every 50 ms) minus its
``ts``; only the steady records count. p50 and p99 over them.

``--quick`` uses :class:`SteadyProducer` with ``prime=False`` on the topic of a job already timed on its
records (benchmarks/peers.py's ``Bench.run_with_latency``): the steady records start once that input is
visible, and :func:`latencies` counts only them.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Any

import numpy as np
import pyarrow.parquet as pq
from _peers_watch import KafkaWatch, ParquetWatch, run_job  # type: ignore[import-not-found]
from confluent_kafka import Producer

PARTITIONS = 4


class SteadyProducer(threading.Thread):
    """Primes (a record every 0.1 s) until ``ready`` is set, then produces ``rate`` records/s for
    ``seconds``; ``sent`` is the total once ``done`` is set."""

    def __init__(self, bootstrap: str, topic: str, rate: int, seconds: float, keys: int = 1_000,
                 prime: bool = True) -> None:  # fmt: skip
        super().__init__(name="steady-producer", daemon=True)
        self.bootstrap, self.topic, self.rate, self.seconds, self.keys = bootstrap, topic, rate, seconds, keys
        self.prime = prime  # False: produce nothing until ``ready`` (the job is known to be running)
        self.ready, self.done, self.stop = threading.Event(), threading.Event(), threading.Event()
        self.sent, self.steady_from_ms = 0, 0
        self.error = ""  # set (with ``done``) when the broker did not take every record
        self.rows: list[tuple[int, float, int]] = []  # (user, amount, ts) of every record produced

    def _one(self, p: Producer, i: int) -> None:
        u, ts = i % self.keys, time.time_ns() // 1_000_000
        value = b'{"user": %d, "amount": %d.5, "ts": %d}' % (u, i % 1000, ts)
        self.rows.append((u, i % 1000 + 0.5, ts))
        while True:
            try:
                p.produce(self.topic, value, key=b"%d" % u, partition=u % PARTITIONS)
                return
            except BufferError:
                p.poll(0.01)

    def run(self) -> None:
        p = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "linger.ms": 5, "log_level": 0})
        i = 0
        while not self.ready.wait(0.1) and not self.stop.is_set():
            if self.prime:
                self._one(p, i)
                p.poll(0)
                i += 1
        self.steady_from_ms = time.time_ns() // 1_000_000
        total, t0 = int(self.rate * self.seconds), time.perf_counter()
        for j in range(total):
            if self.stop.is_set():
                return
            due = (time.perf_counter() - t0) * self.rate
            if j > due:
                time.sleep((j - due) / self.rate)
                p.poll(0)
            self._one(p, i + j)
        left = p.flush(60)
        if left:
            self.error = f"steady producer: {left} of {i + total} records to {self.topic} not delivered within 60 s"
        self.sent = i + total
        self.done.set()

    def total(self) -> int | None:
        """How many records were produced, None while producing; raises when some were not delivered, so a
        job is not waited for up to ``--timeout`` for records that never reached the broker."""
        if not self.done.is_set():
            return None
        if self.error:
            raise RuntimeError(self.error)
        return self.sent


def latency_round(bench: Any, engine: str, case: str, args: argparse.Namespace) -> dict[str, float]:
    """One latency run of ``engine`` on ``case``: p50 and p99 in seconds, and how many records counted."""
    topic = f"peers-lat-{engine}-{case}-{bench.runs + 1}"
    bench.broker.create_topic(topic, PARTITIONS)
    cfg = bench.config(engine, case, topic)
    watch = bench.watch(engine, cfg)
    prod = SteadyProducer(bench.broker.bootstrap, topic, args.latency_rate, args.latency_seconds)
    prod.start()

    def seen(n: int) -> None:
        if n > 0:
            prod.ready.set()

    try:
        run_job(bench.engine(engine)[0], cfg, watch, prod.total,
                args.timeout, seen=seen)  # fmt: skip
    finally:
        prod.stop.set()
        prod.join()
    return latencies(f"{engine} {case}", watch, prod.steady_from_ms, int(args.latency_rate * args.latency_seconds))


def latencies(label: str, watch: Any, steady_from_ms: int, want: int) -> dict[str, float]:
    """p50 and p99 (seconds) of the records produced from ``steady_from_ms`` on: the time the watcher first
    saw each one's file or batch minus its ``ts``; raises unless at least ``want`` of them were seen."""
    lat: list[np.ndarray] = []
    if isinstance(watch, KafkaWatch):
        for t, values in watch.batches:
            ts = np.array([json.loads(v)["ts"] for v in values], dtype=np.int64)
            lat.append(t - ts[ts >= steady_from_ms] / 1000)
    else:
        assert isinstance(watch, ParquetWatch)
        for path, (_rows, t) in watch.files.items():
            ts = pq.read_table(path, columns=["ts"]).column("ts").to_numpy()
            lat.append(t - ts[ts >= steady_from_ms] / 1000)
    every = np.concatenate(lat) if lat else np.array([])
    if len(every) < want:
        raise RuntimeError(f"{label} latency: {len(every)} steady records seen, expected {want}")
    return {"p50_s": float(np.percentile(every, 50)), "p99_s": float(np.percentile(every, 99)), "records": len(every)}
