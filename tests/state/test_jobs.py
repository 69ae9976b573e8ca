"""Keyed state backends inside jobs: timers, the shared files of incremental checkpoints, foreign restores,
key types. (The fault suite runs the keyed shapes on both backends: tests/faults/test_exactly_once.py.)"""

from __future__ import annotations

import decimal
import json
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from sluice import (
    CheckpointConfig,
    ConfigError,
    FixedDelayRestart,
    KeyedProcessFunction,
    NoRestart,
    Pipeline,
    ValueStateDescriptor,
)
from sluice.checkpoint.storage import LocalCheckpointStorage
from sluice.connectors.generator import GeneratorSource
from sluice.sinks.testing import TwoPhaseCommitTestSink, read_committed
from sluice.source import InputStatus, ReaderContext, ReaderOutput, SourceReader, SourceSplit
from sluice.testing.faults import FaultInjector

from tests.faults.backends import BACKENDS, backend_config
from tests.faults.shapes import rows_of
from tests.sinks.tables.paced import Paced

ROCKSDB = {"type": "rocksdb", "incremental": True, "memory": "32 mb"}


class Sessions(KeyedProcessFunction):
    """Counts a key's rows; an event-time timer 50 ms after its last row emits and clears the count."""

    def open(self, ctx: Any) -> None:
        self.n = ValueStateDescriptor("n", 0, serializer="int64")

    def process(self, key: Any, rows: pa.RecordBatch, ctx: Any) -> None:
        st = ctx.state(self.n)
        st.update(st.value() + rows.num_rows)
        ctx.timer_service.register_event_time_timer(pc.max(rows.column("ts")).as_py() + 50)

    def on_timer(self, timestamp: int, key: Any, ctx: Any) -> list[dict[str, Any]]:
        st = ctx.state(self.n)
        out = [{"k": key, "n": st.value(), "at": timestamp}]
        st.clear()
        return out


def sessions_job(d: str, backend: dict[str, Any] | None, attempts: int = 3) -> Pipeline:
    src = GeneratorSource(num_splits=1, records_per_split=600, batch_size=20, step_ms=10, num_keys=7)
    p = Pipeline(
        "sessions",
        checkpoint=CheckpointConfig(interval=0.02, storage=f"{d}/chk"),
        restart=FixedDelayRestart(attempts=attempts, delay=0) if attempts else NoRestart(),
        max_parallelism=16,
        state_backend=backend,
    )
    p.source(src).key_by("key").process(Sessions(), parallelism=2).sink(TwoPhaseCommitTestSink(f"{d}/out"))
    return p


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_timers_and_state_survive_a_crash_on_each_backend(backend: str, tmp_path: Path) -> None:
    """Event-time timers fire with their key (decoded from the backend) and a crash changes nothing: the
    output equals a failure-free run's on the hashmap backend."""
    sessions_job(str(tmp_path / "ref"), None).run(runtime="local", restore="none")
    expected = rows_of(read_committed(f"{tmp_path}/ref/out"))
    faults = FaultInjector(point="process", after=12)
    run = str(tmp_path / "run")
    sessions_job(run, backend_config(backend, run)).run(runtime="local", restore="none", faults=faults)
    assert faults.all_fired
    got = rows_of(read_committed(f"{tmp_path}/run/out"))
    assert got == expected and {r[1] for r in got} == set(range(7))  # (at, k, n): every key fired


class _HeldReader(SourceReader):
    """A generator reader that ends its input only once ``idle`` checkpoints completed after its last row.

    A checkpoint that completes after the reader ran out may still have been triggered before its last rows;
    the ones after it see no new input, so the job's last checkpoints hold the same keyed state."""

    def __init__(self, inner: SourceReader, idle: int) -> None:
        self.inner = inner
        self.idle = idle
        self.ran_out = False
        self.completed_after: list[int] = []

    def start(self) -> None:
        self.inner.start()

    def add_splits(self, splits: list[SourceSplit]) -> None:
        self.inner.add_splits(splits)

    def notify_no_more_splits(self) -> None:
        self.inner.notify_no_more_splits()

    def poll_next(self, output: ReaderOutput) -> InputStatus:
        status = self.inner.poll_next(output)
        if status is not InputStatus.END_OF_INPUT:
            return status
        self.ran_out = True
        # one more than ``idle``: the first completion after running out may predate the last rows
        return status if len(self.completed_after) > self.idle else InputStatus.NOTHING_AVAILABLE

    def snapshot_state(self, checkpoint_id: int) -> list[SourceSplit]:
        return self.inner.snapshot_state(checkpoint_id)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.inner.notify_checkpoint_complete(checkpoint_id)
        if self.ran_out:
            self.completed_after.append(checkpoint_id)

    def close(self) -> None:
        self.inner.close()


class HeldGenerator(Paced):
    """A generator paced by checkpoints (:class:`tests.sinks.tables.paced.Paced`: every ``chunk_batches``
    batches of a reader wait for a checkpoint to complete) whose readers end their input only after ``idle``
    checkpoints without new rows completed (conditions, not times)."""

    idle = 3

    def create_reader(self, ctx: ReaderContext) -> SourceReader:
        return _HeldReader(super().create_reader(ctx), self.idle)


def _referenced(storage: LocalCheckpointStorage) -> dict[int, set[str]]:
    """The shared files each completed checkpoint in the folder references (as its metadata lists them)."""
    out: dict[int, set[str]] = {}
    for cid, path, _ in storage.completed():
        try:
            meta = json.loads(Path(path, "_metadata").read_bytes())
        except FileNotFoundError:  # subsumed meanwhile
            continue
        out[cid] = {p for t in meta["tasks"].values() for p, _ in t.get("shared", [])}
    return out


@pytest.mark.parametrize("backend", ["rocksdb", "rocksdb+changelog", "hashmap+changelog"])
def test_a_shared_file_is_deleted_exactly_when_the_last_checkpoint_using_it_is_subsumed(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Incremental RocksDB checkpoints share SST files, changelog checkpoints their materialization and
    segments; every deletion of one happens when no completed checkpoint left in storage references it, and at
    the end the shared files are exactly those the retained checkpoints reference. An orphan (an upload no
    completed checkpoint references) goes on restore."""
    job = f"{tmp_path}/chk/shared"
    storage = LocalCheckpointStorage(f"{tmp_path}/chk", "shared")
    deleted: list[tuple[str, int]] = []
    early: list[str] = []
    lock = threading.Lock()
    original = LocalCheckpointStorage.delete_file

    def delete_file(self: LocalCheckpointStorage, path: str) -> None:
        rel = path.removeprefix(job + "/")
        if rel.startswith("shared/"):
            with lock:  # the subsumed checkpoint's folder went first, on the same cleanup thread
                users = [cid for cid, files in _referenced(storage).items() if rel in files]
                if users:
                    early.append(f"{rel} still referenced by {users}")
                deleted.append((rel, max(_referenced(storage), default=0)))
        original(self, path)

    monkeypatch.setattr(LocalCheckpointStorage, "delete_file", delete_file)

    class Count(KeyedProcessFunction):
        def open(self, ctx: Any) -> None:
            self.n = ValueStateDescriptor("n", 0, serializer="int64")

        def process(self, key: Any, rows: pa.RecordBatch, ctx: Any) -> None:
            st = ctx.state(self.n)
            st.update(st.value() + rows.num_rows)

    def run(restore: str) -> None:
        # the input is paced by checkpoints (30 checkpoints carry rows however loaded the machine is: more
        # than RocksDB's L0 compaction trigger of 16 flushed files, so compactions replace shared files while
        # it flows; paced by time, a loaded run took too few checkpoints to compact and deleted nothing), and
        # held open after its last row until idle checkpoints completed: whether the job's last checkpoints
        # share files then no longer depends on where the load put the last compaction or materialization
        src = HeldGenerator(chunk_batches=2, num_splits=2, records_per_split=3000, batch_size=50, num_keys=2000)
        p = Pipeline(
            "shared",
            checkpoint=CheckpointConfig(interval=0.1, num_retained=2, storage=f"{tmp_path}/chk"),
            state_backend=BACKENDS[backend],
            max_parallelism=8,
        )
        p.source(src, parallelism=2).key_by("key").process(Count(), parallelism=2).sink(
            TwoPhaseCommitTestSink(f"{tmp_path}/out")
        )
        p.run(runtime="local", restore=restore)

    run("none")
    referenced = _referenced(storage)
    every = set().union(*referenced.values())
    on_disk = {f"shared/{f}" for f in storage.list_files(f"{job}/shared")}
    assert len(storage.completed()) == 2 and every, referenced
    assert on_disk == every, "the shared files are exactly the retained checkpoints' ones"
    assert deleted and not early, early[:3]
    reused = [cid for cid, files in referenced.items() if files & set().union(*(f for c, f in referenced.items() if c != cid))]
    assert reused, ("the retained checkpoints share files", referenced)
    # an upload of a checkpoint that never completed (a crash) is an orphan: deleted when the job restores
    orphan = Path(job, "shared", "gone-0", "x-99-000001.sst")
    orphan.parent.mkdir(parents=True)
    orphan.write_bytes(b"never completed")
    run("latest")
    assert not orphan.exists() and not early
    assert {f"shared/{f}" for f in storage.list_files(f"{job}/shared")} == set().union(*_referenced(storage).values())


def test_a_checkpoint_of_another_job_restores_and_its_files_are_left_alone(tmp_path: Path) -> None:
    """Restoring another job's incremental checkpoint reads its files where they are; the new job uploads its
    own and never deletes the other job's, which stays restorable."""

    def job(name: str, restore: str, faults: Any = None) -> None:
        src = GeneratorSource(num_splits=2, records_per_split=800, batch_size=40, num_keys=50)
        p = Pipeline(
            name,
            checkpoint=CheckpointConfig(interval=0.03, storage=f"{tmp_path}/chk"),
            state_backend=ROCKSDB,
            restart=NoRestart(),
            max_parallelism=8,
        )
        p.source(src).key_by("key").process(Sessions(), parallelism=2).sink(TwoPhaseCommitTestSink(f"{tmp_path}/out"))
        try:  # one output: a restore commits the checkpoint's pending output (again)
            p.run(runtime="local", restore=restore, faults=faults, allow_reprocessing=True)
        except Exception:
            if faults is None:
                raise

    job("a", "none", FaultInjector(point="complete_to_commit", after=2))
    a = LocalCheckpointStorage(f"{tmp_path}/chk", "a")
    ((_, path, _),) = a.completed()
    before = sorted(a.list_files(a.job_dir()))
    job("b", path)
    assert sorted(a.list_files(a.job_dir())) == before, "job b changed job a's files"
    b = LocalCheckpointStorage(f"{tmp_path}/chk", "b")
    meta = json.loads(Path(b.latest() or "", "_metadata").read_bytes())
    assert all(not p.startswith("/") for t in meta["tasks"].values() for p, _ in t.get("shared", []))
    job("c", path)  # a's checkpoint restores again


def test_a_key_type_keyed_state_cannot_store_is_refused_in_one_line(tmp_path: Path) -> None:
    """Keys are int, float, bool, string, binary, date or timestamp values: a decimal key column is refused
    when the job is built (schema known) or, through a key function, when its first key arrives."""
    schema = pa.schema([("id", pa.int64()), ("price", pa.decimal128(10, 2))])

    def with_price(b: pa.RecordBatch) -> pa.RecordBatch:
        prices = pa.array([decimal.Decimal(i % 5) for i in b.column("id").to_pylist()], pa.decimal128(10, 2))
        return pa.RecordBatch.from_arrays([b.column("id"), prices], schema=schema)

    p = Pipeline("keys", checkpoint=CheckpointConfig(storage=f"{tmp_path}/chk"), restart=NoRestart())
    s = p.source(GeneratorSource(num_splits=1, records_per_split=100)).map_batches(with_price, schema=schema)
    with pytest.raises(ConfigError) as err:
        s.key_by("price")
    assert "column 'price' has type decimal128(10, 2)" in str(err.value) and "\n" not in str(err.value)
    s.key_by(lambda b: b.column("price")).process(Sessions()).sink(TwoPhaseCommitTestSink(f"{tmp_path}/out"))
    with pytest.raises(ConfigError) as err:
        p.run(runtime="local", restore="none")
    assert "a state key of type Decimal cannot be stored" in str(err.value) and "\n" not in str(err.value)
