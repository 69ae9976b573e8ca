"""How benchmarks/peers.py runs a job and watches its output: every engine the same way.

:func:`run_job` starts the job as a process of its own (its own session), and from the moment before the
start polls the output until it holds every record; the job's wall time is the span from the process start
to that poll, its CPU time that of the job's whole process tree (JVMs, Python workers) at that poll, its
peak RSS the largest sum of its tree's resident memory over the run (sampled every 0.25 s). Then the tree
is killed: no engine is told where the input ends, so none gets a cheaper end than another.

What counts as visible is what a reader of the output sees, not what the engine says:

* :class:`ParquetWatch` ``rule="files"``: files not hidden (a name starting with ``.`` or ``_``), as
  pyarrow, Spark and Trino list a folder (sluice's FileSink and Flink's filesystem sink rename a file to
  such a name when its checkpoint completes; Quix's sink writes the file in place at its checkpoint, so a
  file whose footer cannot be read yet is not counted until it can); ``rule="spark"``: the files Spark's
  ``_spark_metadata`` log lists (Spark's file sink writes data files first and commits them by that log).
* :class:`KafkaWatch`: a plain ``read_committed`` consumer of the output topic from its start.

Each file and each consumed batch keeps the time it was first seen, for the latency of its records.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pyarrow.parquet as pq
from _common import tree_cpu_seconds, tree_pids, tree_rss_bytes  # type: ignore[import-not-found]
from confluent_kafka import Consumer, TopicPartition

JOBS = Path(__file__).with_name("_peers_jobs.py")


class Watch(Protocol):
    def poll(self) -> int: ...  # records visible now

    def close(self) -> None: ...


class ParquetWatch:
    """Rows visible in the Parquet files under ``folder`` (see the module's doc for ``rule``)."""

    def __init__(self, folder: Path, rule: str = "files") -> None:
        self.folder, self.rule = folder, rule
        self.files: dict[str, tuple[int, float]] = {}  # path -> (rows, first seen visible)
        self._logs: set[str] = set()
        self._listed: set[str] = set()  # spark: files its log lists
        self.rows = 0

    def _candidates(self) -> list[str]:
        if self.rule == "spark":
            meta = self.folder / "_spark_metadata"
            if meta.is_dir():
                for name in sorted(os.listdir(meta)):
                    if name not in self._logs and re.fullmatch(r"\d+(\.compact)?", name):
                        for line in (meta / name).read_text().splitlines()[1:]:  # after the version line
                            entry = json.loads(line)
                            if entry.get("action") == "add":
                                self._listed.add(entry["path"].removeprefix("file://"))
                        self._logs.add(name)
            return [p for p in self._listed if p not in self.files]
        out = []
        for root, dirs, names in os.walk(self.folder):
            dirs[:] = [d for d in dirs if not d.startswith((".", "_"))]
            out += [os.path.join(root, n) for n in names if not n.startswith((".", "_"))]
        return [p for p in out if p not in self.files]

    def poll(self) -> int:
        if not self.folder.is_dir():
            return 0
        now = time.time()
        for path in self._candidates():
            try:
                rows = pq.ParquetFile(path).metadata.num_rows
            except Exception:
                continue
            self.files[path] = (rows, now)
            self.rows += rows
        return self.rows

    def close(self) -> None:
        pass


class KafkaWatch:
    """Records a ``read_committed`` consumer has read from ``topic`` (every partition from offset 0), in a
    thread: ``batches`` holds (time read, values) of every batch."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.batches: list[tuple[float, list[bytes]]] = []
        self.rows = 0
        self._stop = threading.Event()
        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"peers-watch-{time.time_ns()}",
                                   "isolation.level": "read_committed", "enable.auto.commit": False,
                                   "fetch.wait.max.ms": 10, "log_level": 0})  # fmt: skip
        self._consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        self._thread = threading.Thread(target=self._run, name="kafka-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            msgs = self._consumer.consume(10_000, 0.05)
            values = [m.value() for m in msgs if m.error() is None]
            if values:
                self.batches.append((time.time(), values))
                self.rows += len(values)

    def poll(self) -> int:
        return self.rows

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._consumer.close()


@dataclass
class JobRun:
    """One job's run: process start -> every record visible."""

    wall: float  #: seconds from the process start to the poll that saw the last record
    cpu: float  #: CPU seconds of the job's process tree by then
    peak_rss: int  #: the largest summed RSS of its process tree (bytes)
    first_visible: float | None  #: seconds from the start to the first visible output
    extra: dict[str, Any] = field(default_factory=dict)
    split: JobRun | None = None  #: the figures at the poll that first saw ``run_job``'s ``split`` records


def kill_tree(pid: int) -> None:
    """SIGKILL the job's process and everything below it (listed first: orphans would leave the tree)."""
    pids = tree_pids(pid)
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_job(python: str, cfg: dict[str, Any], watch: Watch, expected: int | Callable[[], int | None],
            timeout: float, seen: Callable[[int], None] | None = None, poll_s: float = 0.05,
            split: int | None = None) -> JobRun:  # fmt: skip
    """Start the job, wait until ``watch`` sees ``expected`` records (a callable: how many, None while not
    known yet), kill it; ``seen(n)`` is told the visible count at every poll. With ``split``, the run's
    ``split`` holds the figures (wall, CPU, peak RSS) at the poll that first saw that many records: the job
    timed on a first input while it goes on with more (``--quick``'s latency phase). Raises with the job's
    log tail if it exits or ``timeout`` passes first."""
    out = Path(cfg["out"])
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "job.log"
    env = {**os.environ, "TZ": "UTC", "PYTHONUNBUFFERED": "1"}
    env.pop("PYTHONPATH", None)
    peak, first, last_rss, at_split = 0, None, 0.0, None
    with open(log_path, "wb") as log:
        t0 = time.time()
        proc = subprocess.Popen([python, str(JOBS), json.dumps(cfg)], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, env=env)  # fmt: skip
        try:
            while True:
                n = watch.poll()
                now = time.time()
                if first is None and n > 0:
                    first = now - t0
                if split is not None and at_split is None and n >= split:
                    peak = max(peak, tree_rss_bytes(proc.pid))
                    at_split = JobRun(now - t0, tree_cpu_seconds(proc.pid), peak, first)
                want = expected() if callable(expected) else expected
                if want is not None and n >= want:
                    cpu = tree_cpu_seconds(proc.pid)
                    return JobRun(now - t0, cpu, max(peak, tree_rss_bytes(proc.pid)), first, split=at_split)
                if now - last_rss >= 0.25:
                    peak, last_rss = max(peak, tree_rss_bytes(proc.pid)), now
                if proc.poll() is not None or now - t0 > timeout:
                    why = f"exited with {proc.returncode}" if proc.returncode is not None else f"timed out ({timeout:.0f} s)"
                    tail = log_path.read_bytes()[-4000:].decode(errors="replace")
                    raise RuntimeError(f"{cfg['engine']} {cfg['case']}: {why} with {n} of {expected} records "
                                       f"visible; its log ({log_path}) ends:\n{tail}")  # fmt: skip
                if seen is not None:
                    seen(n)
                time.sleep(poll_s)
        finally:
            kill_tree(proc.pid)
            proc.wait()
            watch.close()
