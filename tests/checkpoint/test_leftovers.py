"""No leftovers after failed checkpoints and failed attempts (issue 21, point 8): folders of declined or
aborted checkpoints (also when a task writes into one after the abort), temporary files of atomic writes,
and registry entries that never read as ended."""

from __future__ import annotations

import errno
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sluice import CheckpointConfig, NoRestart, Pipeline
from sluice.checkpoint.coordinator import CheckpointCoordinator
from sluice.checkpoint.storage import LocalCheckpointStorage
from sluice.checkpoint.storage_loader import checkpoint_storage
from sluice.connectors.generator import GeneratorSource
from sluice.control.registry import ENTRY, RegistryEntry, read_entries
from sluice.sinks.testing import TwoPhaseCommitTestSink, read_committed

from tests.checkpoint.conftest import fill
from tests.checkpoint.storages import use_storage


def incomplete(job_dir: Path) -> list[str]:
    return sorted(d.name for d in job_dir.glob("*-*") if d.is_dir() and not (d / "_metadata").exists())


class _LateWriter(LocalCheckpointStorage):
    """Checkpoint 2: subtask 0's state cannot be written (a full disk), subtask 1's is written only after
    the coordinator aborted the checkpoint (a writer that loses the race with the abort)."""

    def __init__(self, base: str, job_id: str, aborted: threading.Event) -> None:
        super().__init__(base, job_id)
        self.aborted = aborted
        self.late: list[str] = []

    def write_file(self, path: str, data: bytes) -> None:
        if path.endswith("/chk-2/0-0.state"):
            raise OSError(errno.ENOSPC, "No space left on device (injected)", path)
        if path.endswith("/chk-2/0-1.state"):
            assert self.aborted.wait(60), "checkpoint 2 was not aborted"
            self.late.append(path)
        super().write_file(path, data)


def test_a_declined_checkpoint_leaves_no_folder_even_after_a_late_write(tmp_path: Path, monkeypatch: Any) -> None:
    aborted = threading.Event()
    decline = CheckpointCoordinator.decline

    def declined(self: CheckpointCoordinator, task: Any, checkpoint_id: int, reason: str, *failure: Any) -> None:
        decline(self, task, checkpoint_id, reason, *failure)
        if checkpoint_id == 2:
            aborted.set()

    monkeypatch.setattr(CheckpointCoordinator, "decline", declined)
    storage = _LateWriter(str(tmp_path / "chk"), "late", aborted)
    use_storage(monkeypatch, storage)
    p = Pipeline(
        "late",
        parallelism=2,
        checkpoint=CheckpointConfig(interval=0.05, tolerable_failed_checkpoints=5, storage=str(tmp_path / "chk")),
        restart=NoRestart(),
    )
    src = GeneratorSource(num_splits=2, records_per_split=3000, batch_size=50, rows_per_second=6000)
    p.source(src).sink(TwoPhaseCommitTestSink(str(tmp_path / "out")))
    client = p.start(runtime="local", restore="none", control_endpoint=None)
    deadline = time.monotonic() + 120
    while not storage.late:  # the late write happened
        assert client.running and time.monotonic() < deadline, "checkpoint 2 was never written late"
        time.sleep(0.01)
    while (tmp_path / "chk" / "late" / "chk-2").exists():  # and its folder is deleted while the job runs
        assert client.running and time.monotonic() < deadline, "the late write's folder is left"
        time.sleep(0.01)
    result = client.wait(300)
    assert result.status == "finished"
    assert [s.failure_reason for s in result.checkpoints if s.status == "failed"] == ["DECLINED"]
    assert incomplete(tmp_path / "chk" / "late") == []
    assert sorted(read_committed(str(tmp_path / "out")).column("id").to_pylist()) == list(range(6000))  # type: ignore[union-attr]


def test_a_failed_atomic_write_leaves_no_temporary_file(tmp_path: Path) -> None:
    st = checkpoint_storage(str(tmp_path), "job")
    target = tmp_path / "job" / ENTRY
    (target / "in-the-way").mkdir(parents=True)  # the rename onto it fails
    with pytest.raises(OSError):
        st.write_atomic(str(target), b"{}")
    assert [p.name for p in (tmp_path / "job").iterdir()] == [ENTRY]


def test_an_entry_that_cannot_be_marked_ended_is_deleted(tmp_path: Path, tmpfs: Callable[..., Path]) -> None:
    disk = tmpfs(size="256k")
    st = checkpoint_storage(str(disk / "chk"), "job")
    entry = RegistryEntry.new("job", "http://127.0.0.1:1", "local", str(disk / "t.token"), "a-token")
    entry.write(st)
    filler = fill(disk)
    entry.ended("cancelled", "a-token").write(st)  # the disk is full: the entry goes instead
    assert read_entries(str(disk / "chk")) == [] and sorted(p.name for p in (disk / "chk" / "job").iterdir()) == []
    filler.unlink()


def test_an_entry_whose_process_is_gone_reads_as_ended(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    st = checkpoint_storage(str(tmp_path / "chk"), "job")
    entry = RegistryEntry.new("job", "http://127.0.0.1:1", "local", str(tmp_path / "t.token"), "a-token")
    RegistryEntry(**{**entry.__dict__, "pid": gone.pid}).write(st)
    (found,) = read_entries(str(tmp_path / "chk"))
    assert not found.running and found.status == "gone"


def test_a_full_disk_leaves_no_failed_checkpoint_folders_temporary_files_or_running_entries(
    tmp_path: Path, tmpfs: Callable[..., Path]
) -> None:
    """Checkpoints on a small tmpfs that fills up while the job runs: the checkpoints that fail leave no
    folder, the job cancelled while the disk is full leaves no temporary file and no running entry."""
    disk = tmpfs(size="2m")
    p = Pipeline(
        "full",
        checkpoint=CheckpointConfig(interval=0.05, tolerable_failed_checkpoints=10**6, storage=str(disk / "chk")),
        restart=NoRestart(),
    )
    src = GeneratorSource(num_splits=2, records_per_split=10**6, batch_size=50, rows_per_second=2000)
    p.source(src, parallelism=2).sink(TwoPhaseCommitTestSink(str(tmp_path / "out")))
    client = p.start(runtime="local", restore="none", control_endpoint="127.0.0.1:0")
    deadline = time.monotonic() + 120
    while not any(c.status == "completed" for c in client.checkpoint_history):
        assert client.running and time.monotonic() < deadline, "no checkpoint completed"
        time.sleep(0.02)
    fill(disk)
    while sum(c.status == "failed" for c in client.checkpoint_history) < 3:
        assert client.running and time.monotonic() < deadline, "no checkpoint failed on the full disk"
        time.sleep(0.02)
    assert client.cancel().status == "cancelled"
    job_dir = disk / "chk" / "full"
    assert incomplete(job_dir) == [], "folders of failed checkpoints are left"
    assert not list(disk.rglob("*.tmp")), "temporary files are left"
    assert not [e for e in read_entries(str(disk / "chk")) if e.running], "the entry still reads as running"
