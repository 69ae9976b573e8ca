"""Shared parts of the fault tier beyond crashes: a rate-limited input, the three sinks and what a reader of
each sees, waiting for conditions, leftovers, and the scenario log.

The input is the generator source's (ids ``0 .. splits * per_split - 1``, each once), slowed to a rate so a
fault lands while the job runs; whatever happens, the committed output is compared with it. Sinks: the file
sink (Parquet), Delta and Iceberg (tests/sinks/tables/helpers.py), all on a local folder unless S3 is asked for.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from sluice import CheckpointConfig, FixedDelayRestart, JobClient, Pipeline, RestartStrategy
from sluice.connectors.generator import GeneratorSource
from sluice.sink import Sink
from sluice.sinks.files import FileSink

from tests import listing
from tests.faults.contract import missing
from tests.faults.shapes import record
from tests.sinks.conftest import read_visible
from tests.sinks.tables.helpers import Target

__all__ = [
    "SINKS",
    "UNHANDLED_THREAD_ERRORS_FAIL",
    "Input",
    "Output",
    "check_exactly_once",
    "completed",
    "leftovers",
    "log_scenario",
    "pipeline",
    "wait_until",
]

SINKS = ("files", "delta", "iceberg")
#: a thread of the engine that dies of a fault (e.g. the cleanup of a checkpoint raising on the
#: coordinator's thread) hides the failure it should report: the tier's modules fail on it
UNHANDLED_THREAD_ERRORS_FAIL = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
#: deadline of every wait for a condition (a loaded 2-core machine may be slow; a hang fails the test)
DEADLINE = 120.0


@dataclass(frozen=True)
class Input:
    """Generator input: ``splits`` splits of ``per_split`` rows, ``rate`` rows per second per reader."""

    splits: int = 2
    per_split: int = 1000
    rate: float | None = 400.0
    batch: int = 20

    def source(self) -> GeneratorSource:
        return GeneratorSource(
            num_splits=self.splits,
            records_per_split=self.per_split,
            batch_size=self.batch,
            rows_per_second=self.rate,
        )

    @property
    def ids(self) -> list[int]:
        return list(range(self.splits * self.per_split))


@dataclass
class Output:
    """Where a sink of ``kind`` writes under ``root``, and what a reader sees there."""

    kind: str
    root: str  # a local folder, or s3://bucket/prefix
    storage_options: dict[str, Any] | None = None  # the sink's (S3: possibly through a fault proxy)
    reader_fs: Any = None  # S3: a pyarrow filesystem for reading the file sink's output directly
    reader_options: dict[str, Any] | None = None  # S3: table storage options for reading directly
    local: str | None = None  # S3: a local folder for the Iceberg catalog (default: root)

    @property
    def files_root(self) -> str:
        return f"{self.root}/files"

    def target(self, options: dict[str, Any] | None = None) -> Target:
        """The table; read with the direct ``reader_options`` unless ``options`` are given."""
        opts = options if options is not None else self.reader_options or self.storage_options or {}
        return Target(self.kind, f"{self.root}/lake", dict(opts), self.local or self.root)

    def sink(self) -> Sink[Any]:
        if self.kind == "files":
            return FileSink(self.files_root, format="parquet", storage_options=self.storage_options)
        return self.target(dict(self.storage_options or {})).sink()

    def ids(self) -> list[int]:
        """The ids a reader sees (sorted, duplicates kept)."""
        if self.kind == "files":
            root = self.files_root.removeprefix("s3://")
            if self.reader_fs is None and not Path(root).exists():
                return []
            try:
                table = read_visible(root, "parquet", self.reader_fs)
            except FileNotFoundError:
                return []
            return sorted(table.column("id").to_pylist()) if table.num_rows else []
        table = self.target().read()
        return sorted(table.column("id").to_pylist()) if table.num_rows else []

    def committed(self, ids: list[int]) -> bool:
        """Whether a reader sees exactly ``ids`` now (for waits while the job runs: a read that races the
        job's own set-up of the Iceberg catalog, which pyiceberg does not guard, counts as not yet)."""
        if self.kind == "iceberg" and not Path(self.local or self.root, "catalog.db").exists():
            return False
        try:
            return self.ids() == sorted(ids)
        except Exception as exc:
            if "already exists" in str(exc) or "database is locked" in str(exc):
                return False
            raise

    def ids_independently(self) -> list[int]:
        """Tables: the ids another engine reads (DuckDB, Polars); files: the same as :meth:`ids`."""
        if self.kind == "files":
            return self.ids()
        table = self.target().read_independently()
        return sorted(table.column("id").to_pylist()) if table.num_rows else []

    def data_files(self) -> dict[str, int]:
        """Every file under the output's folder (local outputs), with its size: what a run wrote."""
        base = Path(self.files_root if self.kind == "files" else f"{self.root}/lake")
        return {rel: st.st_size for rel, st in listing.files(base).items()}

    def ids_by_checkpoint(self, job_id: str) -> dict[int, list[int]]:
        """The visible (or table-referenced) data files' ids by the checkpoint id in their names."""
        if self.kind == "files":
            root = Path(self.files_root)
            files = ds.dataset(root, format="parquet", partitioning="hive").files if root.exists() else []
            name = re.compile(rf"^part-{re.escape(job_id)}-(\d{{6}})-")
        else:
            files = [f.removeprefix("file://") for f in self.target().files()]
            name = re.compile(rf"^part-{re.escape(job_id)}-(\d{{8}})-")
        out: dict[int, list[int]] = {}
        for f in files:
            m = name.match(f.rsplit("/", 1)[-1])
            assert m, f"a data file without a checkpoint id in its name: {f}"
            out.setdefault(int(m.group(1)), []).extend(pq.read_table(f, columns=["id"]).column("id").to_pylist())
        return out


def pipeline(
    name: str,
    inp: Input,
    out: Output,
    checkpoint: CheckpointConfig,
    restart: RestartStrategy | None = None,
    parallelism: int = 2,
) -> Pipeline:
    """``inp`` -> ``out``'s sink."""
    p = Pipeline(
        name,
        parallelism=parallelism,
        checkpoint=checkpoint,
        restart=restart or FixedDelayRestart(attempts=10, delay=0.2),
    )
    p.source(inp.source()).sink(out.sink())
    return p


def completed(client: JobClient) -> int:
    """Checkpoints the job completed so far (every attempt)."""
    return client.monitor.checkpoint_counts()[0].completed  # the history keeps only the newest


def wait_until(
    cond: Callable[[], bool],
    what: str,
    client: JobClient | None = None,
    limit: float = DEADLINE,
    every: float = 0.05,
    explain: Callable[[], str] | None = None,
) -> None:
    """Wait (up to ``limit`` seconds: a safety limit, not a timing assertion) for ``cond``; fail naming
    ``what`` (and cancel ``client``) if it never holds. With ``client``, a job that ended first fails the
    wait at once, with its error. ``every``: seconds between checks (reading a table is not free);
    ``explain``: what to add to the failure (the job's state then)."""
    deadline = time.monotonic() + limit
    while not cond():
        if client is not None and not client.running:
            try:
                result = client.wait(0)
                detail = f"it ended {result.status} after {result.attempts} attempt(s)"
            except BaseException as exc:
                detail = f"it failed: {type(exc).__name__}: {exc}"
            if cond():
                return
            raise AssertionError(f"the job ended before {what}: {detail}{missing()}")
        if time.monotonic() > deadline:
            state = f" ({explain()})" if explain is not None else ""
            if client is not None:
                client.cancel()
            raise AssertionError(f"timed out after {limit:.0f} s waiting for {what}{state}{missing()}")
        time.sleep(every)


def check_exactly_once(label: str, got: Iterable[int], expected: Iterable[int]) -> None:
    g, e = Counter(got), Counter(expected)
    lost, dup = sum((e - g).values()), sum((g - e).values())
    assert not lost and not dup, f"{label}: {lost} rows lost, {dup} duplicated{missing()}"


def log_scenario(
    family: str, scenario: str, sink: str, fired: bool, got: Iterable[int], expected: Iterable[int]
) -> None:
    """Count the scenario in the fault summary (tests/conftest.py: "beyond crashes" by family), with the
    rows it lost and duplicated; ``fired``: its fault verifiably happened."""
    record(family, scenario, sink, "aligned", fired, 0, list(got), list(expected), tier="beyond")


#: names a job may leave in its checkpoint folder: completed checkpoints, savepoints, its records
_KEPT = re.compile(r"^(chk-\d+|savepoint-\d+|_stats\.jsonl|_control\.json|_control\.token|_checkpoints)$")


def leftovers(checkpoints: Path, out: Path | None = None) -> list[str]:
    """What failed checkpoints and attempts left behind under a job's checkpoint folder and a sink's local
    output: folders of checkpoints that never completed, temporary or empty files, unknown names, hidden
    files among the output, a registry entry never marked ended."""
    import json

    left: dict[str, str] = {}
    for job in sorted(p for p in checkpoints.iterdir() if p.is_dir()) if checkpoints.exists() else []:
        for entry in sorted(job.iterdir()):
            if not _KEPT.match(entry.name):
                left[str(entry)] = "unknown"
            elif entry.is_dir() and not (entry / "_metadata").exists():
                left[str(entry)] = "a checkpoint that never completed"
        for rel, st in listing.files(job).items():
            if st.st_size == 0 or ".tmp" in rel.rsplit("/", 1)[-1]:
                left[str(job / rel)] = f"{st.st_size} bytes"
        entry_file = job / "_control.json"
        if entry_file.exists() and json.loads(entry_file.read_text()).get("status") is None:
            left[str(entry_file)] = "a registry entry never marked ended"
    if out is not None and out.exists():
        for f in listing.file_paths(out):
            if f.name.startswith(".") or ".tmp" in f.name:
                left[str(f)] = "hidden or temporary"
    return [f"{path} ({why})" for path, why in left.items()]
