"""How a task ends: its checkpoint uploads end before its operators dispose of their state backends, a failed
attempt's upload threads end before the next attempt starts (or are named in a warning), and changelog
materializations start between batches, not only at checkpoints.

Every ordering is forced with latches (events the engine's own progress sets), never with sleeps: each test
fails deterministically on the code before the change it covers.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from sluice import (
    CheckpointConfig,
    FixedDelayRestart,
    KeyedProcessFunction,
    NoRestart,
    Pipeline,
    ValueStateDescriptor,
)
from sluice.connectors.generator import GeneratorSource
from sluice.operators.keyed import KeyedProcessOperator
from sluice.runtime.attempt import JobAttempt
from sluice.runtime.fault_hook import FaultHook
from sluice.runtime.job import run_job
from sluice.runtime.local import LocalRuntime
from sluice.runtime.task import Task
from sluice.sinks.files import CompactionPolicy, FileSink, RollingPolicy
from sluice.sinks.testing import TwoPhaseCommitTestSink, read_committed
from sluice.source import InputStatus, ReaderContext, ReaderOutput, SourceReader, SourceSplit
from sluice.state.rocksdb.backend import RocksDBKeyedStateBackend
from sluice.state.rocksdb.snapshot import IncrementalSnapshot
from sluice.testing.faults import InjectedFault

from tests import listing
from tests.sinks.conftest import local_files, read_visible, same_rows

DEADLINE = 120.0  # seconds a latch waits for the engine before the test gives up (a generous bound)


def wait_until(cond: Callable[[], bool], what: str, problems: list[str]) -> bool:
    """Wait for ``cond`` (checked on every tick of a short event wait); record ``what`` if it never held."""
    tick = threading.Event()
    end = time.monotonic() + DEADLINE
    while not cond():
        if time.monotonic() > end:
            problems.append(f"gave up waiting for {what}")
            return False
        tick.wait(0.005)
    return True


class Count(KeyedProcessFunction):
    """Counts each key's rows in keyed state; emits nothing until the end (then one row per key)."""

    def open(self, ctx: Any) -> None:
        self.n = ValueStateDescriptor("n", 0, serializer="int64")

    def process(self, key: Any, rows: pa.RecordBatch, ctx: Any) -> list[dict[str, Any]]:
        st = ctx.state(self.n)
        st.update(st.value() + rows.num_rows)
        return [{"key": key, "rows": rows.num_rows}]


def count_job(d: Path, backend: dict[str, Any] | None, interval: float | None, **kw: Any) -> Pipeline:
    p = Pipeline(
        "task-close",
        checkpoint=CheckpointConfig(
            interval=interval,
            max_concurrent=kw.pop("max_concurrent", 1),
            # concurrent incremental checkpoints: one may reuse a file a later completed one let go (declined)
            tolerable_failed_checkpoints=100,
            storage=f"{d}/chk",
        ),
        restart=FixedDelayRestart(attempts=2, delay=0) if kw.pop("restart", False) else NoRestart(),
        max_parallelism=8,
        state_backend=backend,
        **kw,
    )
    return p


def committed_rows(d: Path) -> int:
    out = read_committed(f"{d}/out")
    assert out is not None
    return sum(out.column("rows").to_pylist())


def keyed_task(a: JobAttempt) -> Task:
    return next(t for t in a.tasks.values() if any(isinstance(op, KeyedProcessOperator) for op in t.operators))


def closing(task: Task) -> bool:
    """The task stopped its uploads (False on code without that step)."""
    return bool(getattr(getattr(task.checkpointing, "uploads", None), "closing", False))


# -- 1. a finished task: the running upload ends (cancelled at its next step) before the backend is disposed ---------------------
def test_a_finished_task_ends_its_running_upload_before_its_rocksdb_backend_is_disposed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The keyed task's final checkpoint's upload is held until the task took one more snapshot, so that
    snapshot's upload is in flight when the final checkpoint completes and the task finishes; that upload is
    then held until the task closes. Its RocksDB checkpoint folder must still be there: the backend is
    disposed only after the upload ended (before the fix: ``upload failed: No such file``)."""
    attempts: list[JobAttempt] = []
    problems: list[str] = []
    log: list[str] = []
    lock = threading.Lock()
    running = [0]
    disposed = threading.Event()
    original_run, original_dispose = IncrementalSnapshot.run, RocksDBKeyedStateBackend.dispose

    def run(self: IncrementalSnapshot) -> Any:
        cid: int = self._cid
        task = keyed_task(attempts[-1])
        final = task.finishing.final_after
        if final == cid:  # hold the final upload until a later snapshot is queued behind it
            log.append(f"held final {cid}")
            wait_until(lambda: task.checkpointing.last_triggered > cid, "a snapshot after the final one", problems)
        elif final is not None and cid > final:  # in flight when the task finishes: held until it closes
            log.append(f"after final {cid}")
            # (or until the final checkpoint failed: then a later one, maybe this one, finishes the task)
            ended = lambda: disposed.is_set() or closing(task) or task.finishing.final_after != final  # noqa: E731
            wait_until(ended, "the task's end", problems)
        with lock:
            running[0] += 1
        try:
            return original_run(self)
        except Exception as exc:
            # only the local side counts (a subsumed checkpoint's folder in storage may go under a late upload)
            if str(tmp_path / "rocks") in str(exc).split(" -> ")[0]:
                problems.append(f"upload of checkpoint {cid} failed: {exc}")
            raise
        finally:
            with lock:
                running[0] -= 1

    def dispose(self: RocksDBKeyedStateBackend) -> None:
        with lock:
            if running[0]:
                problems.append("the backend was disposed under a running upload")
        disposed.set()
        original_dispose(self)

    monkeypatch.setattr(IncrementalSnapshot, "run", run)
    monkeypatch.setattr(RocksDBKeyedStateBackend, "dispose", dispose)
    # full native checkpoints (the same folder under the upload; no reuse for concurrent checkpoints to refuse)
    rocksdb = {"type": "rocksdb", "incremental": False, "memory": "32 mb", "local_dir": f"{tmp_path}/rocks"}
    p = count_job(tmp_path, rocksdb, interval=0.02, max_concurrent=2)
    src = GeneratorSource(num_splits=1, records_per_split=400, batch_size=20, num_keys=5)
    p.source(src).key_by("key").process(Count(), parallelism=1).sink(TwoPhaseCommitTestSink(f"{tmp_path}/out"))
    result = run_job(p.build(), p.job_config(restore="none"), LocalRuntime().run_attempt, on_attempt=attempts.append)
    assert not problems, problems
    assert any(e.startswith("held final") for e in log), log
    assert result.attempts == 1 and committed_rows(tmp_path) == 400
    declined = [s for s in result.checkpoints if "upload failed" in (s.failure_detail or "")]
    assert not declined, declined


# -- 2. a failed attempt: its upload threads end before the next attempt starts -----------------------------
class HoldUploadThenCrash:
    """A fault hook: holds the first upload that reaches ``point`` (on the upload thread: ``snapshot_to_ack``,
    or ``compaction``, a sink compactor's asynchronous part) in attempt 0, then crashes the next batch a task
    processes; the held upload goes on once the next attempt started or its task stopped its uploads (or,
    with ``until``, once that event is set)."""

    def __init__(
        self, attempts: list[JobAttempt], until: threading.Event | None = None, point: str = "snapshot_to_ack"
    ) -> None:
        self.attempts = attempts
        self.until = until
        self.point = point
        self.held = threading.Event()
        self.held_in = ""  # the task whose upload is held
        self.crashed = threading.Event()
        self.next_started = threading.Event()
        self.problems: list[str] = []
        self.fired: list[str] = []
        self._lock = threading.Lock()

    def hit(self, point: str, where: str = "") -> None:
        if point == self.point and len(self.attempts) == 1:
            with self._lock:
                first = not self.held.is_set()
                self.held.set()
            if first:
                self.held_in = where
                self.fired.append(f"held upload of {where}")
                a = self.attempts[0]
                if self.until is not None:
                    wait_until(self.until.is_set, "the warning", self.problems)
                else:
                    wait_until(
                        lambda: self.next_started.is_set() or any(closing(t) for t in a.tasks.values()),
                        "the end of the failed attempt",
                        self.problems,
                    )
        elif point == "process" and self.held.is_set() and not self.crashed.is_set():
            with self._lock:
                if self.crashed.is_set():
                    return
                self.crashed.set()
            self.fired.append(f"crash:process@{where}")
            raise InjectedFault(f"injected fault at process in {where}")

    def for_attempt(self, attempt: int) -> FaultHook | None:
        return None

    def in_slot(self, slot: int, report: Callable[[str], None]) -> FaultHook | None:
        return None

    def record(self, description: str) -> None:
        self.fired.append(description)


def crash_job(tmp_path: Path, **kw: Any) -> Pipeline:
    p = count_job(tmp_path, None, interval=0.05, restart=True, **kw)
    src = GeneratorSource(num_splits=2, records_per_split=1500, batch_size=10, num_keys=7, rows_per_second=1500)
    p.source(src).key_by("key").process(Count(), parallelism=2).sink(TwoPhaseCommitTestSink(f"{tmp_path}/out"))
    return p


def upload_threads_of(a: JobAttempt) -> list[str]:
    names = {f"upload-{sid}" for sid in a.tasks}
    return sorted(t.name for t in threading.enumerate() if t.name.split("_")[0] in names)


def test_a_failed_attempt_s_upload_threads_end_before_the_next_attempt_starts(tmp_path: Path) -> None:
    """An upload of attempt 0 is held when a crash fails the attempt. The next attempt starts only once that
    upload thread ended (cancelled at its next step), so nothing of the failed attempt writes after the
    restart's recovery (before: the thread was still running when attempt 1 began)."""
    attempts: list[JobAttempt] = []
    hook = HoldUploadThenCrash(attempts)
    alive_at_restart: list[str] = []

    def on_attempt(a: JobAttempt) -> None:
        if attempts:
            alive_at_restart.extend(upload_threads_of(attempts[0]))
            hook.next_started.set()
        attempts.append(a)

    p = crash_job(tmp_path)
    result = run_job(p.build(), p.job_config(restore="none"), LocalRuntime().run_attempt, hook, on_attempt=on_attempt)
    assert not hook.problems, hook.problems
    assert hook.crashed.is_set() and result.attempts == 2, hook.fired
    assert alive_at_restart == [], alive_at_restart
    assert committed_rows(tmp_path) == 3000


def test_a_failed_attempt_s_compaction_ends_before_the_next_attempt_recovers_the_file_sink(tmp_path: Path) -> None:
    """A file sink compactor's asynchronous part (merging staged files) is held when a crash fails the
    attempt; it ends before the next attempt starts (and so before the sink's recovery sweeps what the failed
    attempt left): readers see every row once and no staged file is left."""
    attempts: list[JobAttempt] = []
    hook = HoldUploadThenCrash(attempts, point="compaction")
    alive_at_restart: list[str] = []

    def on_attempt(a: JobAttempt) -> None:
        if attempts:
            alive_at_restart.extend(upload_threads_of(attempts[0]))
            hook.next_started.set()
        attempts.append(a)

    src = GeneratorSource(num_splits=2, records_per_split=600, batch_size=20, num_keys=8, rows_per_second=1200)
    p = count_job(tmp_path, None, interval=0.05, restart=True)
    sink = FileSink(
        str(tmp_path / "files"),
        bucket_by=["b"],
        rolling=RollingPolicy(max_size=1500),
        compaction=CompactionPolicy(target_size=10**6, max_checkpoints=1),
    )
    p.source(src).map_batches(lambda b: b.append_column("b", pc.bit_wise_and(b.column("key"), 3))).key_by(
        "b"
    ).process(Identity()).sink(sink)
    result = run_job(p.build(), p.job_config(restore="none"), LocalRuntime().run_attempt, hook, on_attempt=on_attempt)
    assert not hook.problems, hook.problems
    assert hook.crashed.is_set() and result.attempts == 2, hook.fired
    assert alive_at_restart == [], alive_at_restart
    same_rows(read_visible(str(tmp_path / "files")), src.expected())
    staged = [f for f in local_files(str(tmp_path / "files")) if Path(f).name.startswith(".")]
    assert not staged, staged


class Identity(KeyedProcessFunction):
    def process(self, key: Any, rows: pa.RecordBatch, ctx: Any) -> pa.RecordBatch:
        return rows


def test_an_upload_thread_that_does_not_stop_in_time_is_named_in_a_warning(tmp_path: Path) -> None:
    """With ``task_cancellation_timeout=0`` the held upload cannot end in time: the restart goes on and a
    warning names the upload thread (the latch lets the upload go once a warning was logged; the runtime's
    own warning, naming the task's threads still running then, may follow)."""
    attempts: list[JobAttempt] = []
    warned = threading.Event()
    messages: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            text = record.getMessage()
            if record.levelno >= logging.WARNING and "upload-" in text and "within" in text:
                messages.append(text)
                warned.set()

    hook = HoldUploadThenCrash(attempts, until=warned)
    handler = Catch()
    root = logging.getLogger("sluice")
    level = root.level
    root.setLevel(logging.WARNING)  # the suite keeps sluice's logs at ERROR
    root.addHandler(handler)
    try:
        p = crash_job(tmp_path, task_cancellation_timeout=0)
        result = run_job(p.build(), p.job_config(restore="none"), LocalRuntime().run_attempt, hook, on_attempt=attempts.append)
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        warned.set()  # never leave the held upload waiting
    assert not hook.problems, hook.problems
    assert result.attempts == 2 and committed_rows(tmp_path) == 3000
    # the held upload thread is alive until a warning came (the task's own, or the runtime's): it names it
    held = next(f"upload-{sid}" for sid, t in attempts[0].tasks.items() if t.name == hook.held_in)
    assert any(re.search(rf"\b{re.escape(held)}\b.*within 0s", m) for m in messages), (held, messages)


def test_task_cancellation_timeout_is_checked_when_the_pipeline_is_built() -> None:
    from sluice import ConfigError

    with pytest.raises(ConfigError, match=r"Pipeline\(task_cancellation_timeout\): must be a duration >= 0 \(got -1\)"):
        Pipeline("bad", task_cancellation_timeout=-1)


# -- 3. changelog materializations start between batches ----------------------------------------------------
HOLD = threading.Event()


class _HeldReader(SourceReader):
    """A generator reader whose input ends only once :data:`HOLD` is set."""

    def __init__(self, inner: SourceReader) -> None:
        self.inner = inner

    def start(self) -> None:
        self.inner.start()

    def add_splits(self, splits: list[SourceSplit]) -> None:
        self.inner.add_splits(splits)

    def notify_no_more_splits(self) -> None:
        self.inner.notify_no_more_splits()

    def poll_next(self, output: ReaderOutput) -> InputStatus:
        status = self.inner.poll_next(output)
        return InputStatus.NOTHING_AVAILABLE if status is InputStatus.END_OF_INPUT and not HOLD.is_set() else status

    def snapshot_state(self, checkpoint_id: int) -> list[SourceSplit]:
        return self.inner.snapshot_state(checkpoint_id)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.inner.notify_checkpoint_complete(checkpoint_id)

    def close(self) -> None:
        self.inner.close()


class HeldGenerator(GeneratorSource):
    def create_reader(self, ctx: ReaderContext) -> SourceReader:
        return _HeldReader(super().create_reader(ctx))


@pytest.fixture
def hold() -> Iterator[threading.Event]:
    HOLD.clear()
    yield HOLD
    HOLD.set()


def test_a_changelog_materialization_starts_between_batches_without_a_checkpoint(
    tmp_path: Path, hold: threading.Event
) -> None:
    """No periodic checkpoint runs (``interval=None``); the input is held open until a materialization of
    the changelog state is in checkpoint storage, which only the task's between-batch call can have started
    (before: materializations began only at checkpoints, so none came)."""
    changelog = {"type": "hashmap", "changelog": True, "changelog_materialize_interval": 0.05}
    p = count_job(tmp_path, changelog, interval=None)
    src = HeldGenerator(num_splits=1, records_per_split=200, batch_size=20, num_keys=5)
    p.source(src).key_by("key").process(Count(), parallelism=1).sink(TwoPhaseCommitTestSink(f"{tmp_path}/out"))
    client = p.start(runtime="local", restore="none", control_endpoint=None)
    shared = tmp_path / "chk" / "task-close" / "shared"
    problems: list[str] = []
    try:
        found = wait_until(lambda: bool(listing.file_paths(shared, "*-m*")), "a materialization", problems)
    finally:
        hold.set()
    result = client.wait(DEADLINE)
    assert found, problems
    assert result.last_checkpoint is not None and committed_rows(tmp_path) == 200


def test_task_cancellation_timeout_has_a_flink_key() -> None:
    from sluice.settings import configure

    p = configure(Pipeline("keyed-timeout"), {"task.cancellation.timeout": "5 s"})
    assert p.job_config().task_cancellation_timeout == 5.0
