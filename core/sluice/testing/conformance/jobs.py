"""The contracts inside a real job: the in-process runtime, checkpoints every 50 ms, one crash, a restore.

The other checks drive a connector's SPI in one thread; these run it in the engine, with its threads,
mailboxes, barriers and restart strategy, and compare the committed output with what a failure-free run
must give. A source runs into a small in-memory two-phase-commit sink; a sink gets the case's data from a
small bounded source of the kit. The crash is injected with :class:`sluice.testing.faults.FaultInjector`.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from sluice.api import Pipeline
from sluice.config import FixedDelayRestart
from sluice.errors import ConfigError
from sluice.sink import CommitOutcome, Committer, Sink, SinkContext, SinkWriter
from sluice.source import (
    Boundedness,
    EnumeratorContext,
    InputStatus,
    ReaderContext,
    ReaderOutput,
    Source,
    SourceReader,
    SourceSplit,
    SplitEnumerator,
)
from sluice.testing.conformance.contracts import (
    SOURCE_CONTRACTS,
    ConformanceError,
    attributed,
    diff_records,
    row_counts,
)
from sluice.testing.conformance.sink_harness import violation as sink_violation
from sluice.testing.conformance.sinks import SinkCase, _expect
from sluice.testing.conformance.source_harness import violation as source_violation
from sluice.testing.conformance.sources import SourceCase
from sluice.testing.faults import FaultInjector

__all__ = ["check_sink_in_a_job", "check_source_in_a_job"]

#: committed and staged batches of the in-memory sinks, by sink token (the engine may copy the Sink object)
_STORES: dict[str, dict[str, dict[str, list[pa.RecordBatch]]]] = {}
_LOCK = threading.Lock()


class _MemorySink(Sink[str]):
    """Two-phase commit into memory: staged per (job, attempt, subtask, checkpoint), committed once."""

    name = "conformance-memory"

    def __init__(self, token: str) -> None:
        self.token = token
        with _LOCK:
            _STORES.setdefault(token, {"staged": {}, "committed": {}})

    def store(self) -> dict[str, dict[str, list[pa.RecordBatch]]]:
        return _STORES[self.token]

    def create_writer(self, ctx: SinkContext, restored: list[Any]) -> SinkWriter[str]:
        return _MemoryWriter(self, ctx)

    def create_committer(self, ctx: SinkContext) -> Committer[str] | None:
        return _MemoryCommitter(self)

    def recover(self, job_id: str, committables: Sequence[str]) -> None:
        keep = set(committables)
        with _LOCK:
            staged = self.store()["staged"]
            for k in [k for k in staged if k not in keep]:
                del staged[k]

    def committed(self) -> list[pa.RecordBatch]:
        with _LOCK:
            return [b for k in sorted(self.store()["committed"]) for b in self.store()["committed"][k]]


class _MemoryWriter(SinkWriter[str]):
    def __init__(self, sink: _MemorySink, ctx: SinkContext) -> None:
        self.sink, self.ctx, self.buffer = sink, ctx, []  # type: ignore[var-annotated]

    def write(self, batch: pa.RecordBatch) -> None:
        self.buffer.append(batch)

    def prepare_commit(self, checkpoint_id: int) -> list[str]:
        if not self.buffer:
            return []
        key = f"{checkpoint_id:08d}-{self.ctx.subtask:03d}-a{self.ctx.attempt}"
        with _LOCK:
            self.sink.store()["staged"][key] = self.buffer
        self.buffer = []
        return [key]


class _MemoryCommitter(Committer[str]):
    def __init__(self, sink: _MemorySink) -> None:
        self.sink = sink

    def commit(self, committables: Sequence[str]) -> CommitOutcome:
        published = 0
        with _LOCK:
            store = self.sink.store()
            for k in committables:
                if k not in store["committed"]:
                    store["committed"][k] = store["staged"].pop(k)
                    published += 1
        return CommitOutcome.COMMITTED if published else CommitOutcome.ALREADY_COMMITTED


class _DataSource(Source):
    """The case's data for a sink check: split ``i`` is what subtask ``i`` writes, one batch per poll. A
    reader ends its input only once ``linger`` checkpoints completed in its attempt, so a crash armed at a
    checkpoint's completion fires however fast the sink writes."""

    name = "conformance-data"

    def __init__(self, case: SinkCase, linger: int = 0) -> None:
        self.linger = linger
        self.batches = {
            i: [b for r in range(1, case.rounds + 1) for b in case.data(r)[i]] for i in range(case.parallelism)
        }

    @property
    def boundedness(self) -> Boundedness:
        return Boundedness.BOUNDED

    def create_enumerator(self, ctx: EnumeratorContext, restored: Any | None) -> SplitEnumerator:
        return _DataEnumerator(self, ctx, restored)

    def create_reader(self, ctx: ReaderContext) -> SourceReader:
        return _DataReader(self)


class _DataEnumerator(SplitEnumerator):
    def __init__(self, src: _DataSource, ctx: EnumeratorContext, restored: list[SourceSplit] | None) -> None:
        self.ctx = ctx
        if restored is None:
            restored = [SourceSplit(str(i), 0, len(b)) for i, b in src.batches.items()]
        self.pending = {s.split_id: s for s in restored}
        self.signalled: set[int] = set()

    def add_reader(self, subtask: int) -> None:
        self.signalled.discard(subtask)
        self._assign()

    def add_splits_back(self, splits: list[SourceSplit]) -> None:
        self.pending.update((s.split_id, s) for s in splits)
        self._assign()

    def _assign(self) -> None:
        registered = set(self.ctx.registered_readers())
        out: dict[int, list[SourceSplit]] = {}
        for sid in sorted(self.pending):
            if int(sid) % self.ctx.parallelism in registered:
                out.setdefault(int(sid) % self.ctx.parallelism, []).append(self.pending.pop(sid))
        self.ctx.assign_splits(out)
        waiting = {int(sid) % self.ctx.parallelism for sid in self.pending}
        for r in sorted(registered - waiting - self.signalled):
            self.signalled.add(r)
            self.ctx.signal_no_more_splits(r)

    def snapshot_state(self, checkpoint_id: int) -> list[SourceSplit]:
        return list(self.pending.values())


class _DataReader(SourceReader):
    def __init__(self, src: _DataSource) -> None:
        self.src, self.splits, self.no_more = src, {}, False  # type: ignore[var-annotated]
        self.completed = 0

    def add_splits(self, splits: list[SourceSplit]) -> None:
        self.splits.update((s.split_id, SourceSplit(s.split_id, s.position, s.end)) for s in splits)

    def notify_no_more_splits(self) -> None:
        self.no_more = True

    def poll_next(self, output: ReaderOutput) -> InputStatus:
        for s in self.splits.values():
            if s.position < s.end:
                output.emit(self.src.batches[int(s.split_id)][s.position])
                s.position += 1
                return InputStatus.MORE_AVAILABLE
        done = self.no_more and self.completed >= self.src.linger
        return InputStatus.END_OF_INPUT if done else InputStatus.NOTHING_AVAILABLE

    def snapshot_state(self, checkpoint_id: int) -> list[SourceSplit]:
        return [SourceSplit(s.split_id, s.position, s.end) for s in self.splits.values()]

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.completed += 1


def _run(pipeline: Pipeline, faults: FaultInjector, what: str) -> None:
    result = pipeline.run(runtime="local", restore="none", faults=faults)
    if not faults.fired:
        raise ConfigError(f"{what}: the injected crash never fired; give the case more data")
    if result.status != "finished":
        raise RuntimeError(f"the job ended {result.status}")


def _paced(batch: pa.RecordBatch) -> pa.RecordBatch:
    time.sleep(0.005)  # a little work per batch, so that checkpoints complete while the source is mid-way
    return batch


def check_source_in_a_job(case: SourceCase, crash_after: int = 0) -> None:
    """The source in a job at the case's parallelism (checkpoints every 50 ms, 5 ms of work per batch)
    crashes once, right after checkpoint ``crash_after + 1`` completed, and restarts from it: the
    committed output holds every expected record exactly once."""
    token = uuid.uuid4().hex
    storage = tempfile.mkdtemp(prefix="sluice-conformance-")
    sink = _MemorySink(token)
    try:
        p = Pipeline(
            f"conformance-source-{token[:8]}",
            parallelism=case.parallelism,
            checkpoint={"interval": 0.05, "storage": storage},
            restart=FixedDelayRestart(attempts=5, delay=0),
        )
        stream = p.source(case.source)
        stream.map_batches(_paced, name="paced").sink(sink, name="collect")
        for i, tag in enumerate(case.source.side_outputs):
            stream.side_output(tag).sink(_MemorySink(f"{token}-{i}"), name=f"side-{i}")
        what = (
            f"a job at parallelism {case.parallelism} that crashed once checkpoint {crash_after + 1} completed"
        )
        with attributed("source", SOURCE_CONTRACTS["in_job"], what):
            _run(p, FaultInjector(point="complete_to_commit", after=crash_after), what)
        d = diff_records(case.expected_counts, row_counts(sink.committed(), case.identifying_columns))
        if not d.ok:
            raise source_violation(
                "in_job",
                f"{what} and restored from it: {d.describe()}. Positions, enumerator "
                "state and the reader's threads must keep exactly-once in the engine too.",
            )
    finally:
        shutil.rmtree(storage, ignore_errors=True)
        with _LOCK:
            for k in [k for k in _STORES if k.startswith(token)]:
                del _STORES[k]


def check_sink_in_a_job(case: SinkCase, crash_after: int = 1) -> None:
    """The sink in a job (the case's data from a bounded source, checkpoints every 50 ms) crashes once
    between a checkpoint's completion and its commit and restarts: a reader sees every record exactly
    once and nothing stays staged."""
    t = case.target()
    storage = tempfile.mkdtemp(prefix="sluice-conformance-")
    try:
        p = Pipeline(
            f"conformance-sink-{uuid.uuid4().hex[:8]}",
            parallelism=case.parallelism,
            checkpoint={"interval": 0.05, "storage": storage},
            restart=FixedDelayRestart(attempts=5, delay=0),
        )
        p.source(_DataSource(case, linger=crash_after + 1)).sink(t.sink, name="sink-under-test")
        what = "a job that crashed between a checkpoint's completion and its commit"
        try:
            _run(p, FaultInjector(point="complete_to_commit", after=crash_after), what)
        except (ConformanceError, ConfigError):
            raise
        except Exception as exc:
            raise sink_violation("in_job", f"{what}: the job failed: {type(exc).__name__}: {exc}") from exc
        _expect(case, t, case.expected(range(1, case.rounds + 1)), "in_job", f"{what}, at its end", exact=True)
        left = sorted(t.staged())
        if left:
            raise sink_violation("in_job", f"{what}: after the job finished the sink still holds staged data {left[:5]}")
    finally:
        shutil.rmtree(storage, ignore_errors=True)
