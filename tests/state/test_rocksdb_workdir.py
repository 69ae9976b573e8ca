"""RocksDB working folders a killed process left behind are deleted by the next one (issue 39: a job killed
every few minutes left four folders each time, forever); folders a live process uses, and folders this
module did not make, are left alone. An attempt that fails before its tasks start closes their RocksDB
instances at once (before: every such restart left its instances open and their folders on disk), and so
does one that fails while building its tasks (those built before the failure)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from sluice import CheckpointConfig, FixedDelayRestart, JobFailedError, Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.sinks.testing import TwoPhaseCommitTestSink
from sluice.state.config import StateBackendConfig
from sluice.state.keygroups import KeyGroupRange
from sluice.state.rocksdb.backend import RocksDBStateBackend
from sluice.state.transfer import LocalFileTransfer

CHILD = """
import os, signal, sys, time
from sluice.state.config import StateBackendConfig
from sluice.state.keygroups import KeyGroupRange
from sluice.state.rocksdb.backend import RocksDBStateBackend
from sluice.state.transfer import LocalFileTransfer

be = RocksDBStateBackend(StateBackendConfig(type="rocksdb", local_dir={local!r})).create_keyed_backend(
    "dedup-0", KeyGroupRange(0, 3), 4, LocalFileTransfer({remote!r}))
print(be.root, flush=True)
if sys.argv[1] == "die":
    os.kill(os.getpid(), signal.SIGKILL)  # no dispose, no atexit: what a kill -9 leaves
sys.stdin.readline()  # "live": runs until told to end
be.dispose()
"""


def child(tmp: Path, mode: str) -> tuple[subprocess.Popen[str], str]:
    code = textwrap.dedent(CHILD.format(local=str(tmp / "local"), remote=str(tmp / "remote")))
    p = subprocess.Popen([sys.executable, "-c", code, mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    return p, p.stdout.readline().strip()


def test_folders_of_killed_processes_are_deleted_by_the_next_backend(tmp_path: Path) -> None:
    killed = []
    for _ in range(2):
        p, root = child(tmp_path, "die")
        assert p.wait(60) == -9 and Path(root).is_dir(), root  # left behind
        killed.append(root)
    live, live_root = child(tmp_path, "live")
    foreign = tmp_path / "local" / "not-ours"
    foreign.mkdir()
    (foreign / "data").write_text("kept")
    try:
        config = StateBackendConfig(type="rocksdb", local_dir=str(tmp_path / "local"))
        be = RocksDBStateBackend(config).create_keyed_backend(
            "dedup-0", KeyGroupRange(0, 3), 4, LocalFileTransfer(str(tmp_path / "remote"))
        )
        left = sorted(str(p) for p in (tmp_path / "local").iterdir())
        assert left == sorted([live_root, be.root, str(foreign)]), left
        # this process's own folder is in use as well: a second backend keeps it
        other = RocksDBStateBackend(config).create_keyed_backend(
            "dedup-1", KeyGroupRange(0, 3), 4, LocalFileTransfer(str(tmp_path / "remote"))
        )
        assert Path(be.root).exists() and Path(other.root).exists()
        be.dispose()
        other.dispose()
    finally:
        assert live.stdin is not None
        live.stdin.write("end\n")
        live.stdin.close()
        assert live.wait(60) == 0
    assert sorted(p.name for p in (tmp_path / "local").iterdir()) == ["not-ours"]


class EnumeratorFails(GeneratorSource):
    """A source whose enumerator cannot start (as a Kafka source whose brokers are unreachable): the
    attempt fails after its tasks were built (their keyed backends opened), before they started."""

    def create_enumerator(self, ctx: Any, restored: Any | None) -> Any:
        raise RuntimeError("no broker reachable (a test)")


def test_an_attempt_that_fails_before_its_tasks_start_releases_their_rocksdb(tmp_path: Path) -> None:
    local = tmp_path / "local"
    p = Pipeline(
        "unstarted",
        parallelism=2,
        checkpoint=CheckpointConfig(interval=1.0, storage=str(tmp_path / "chk")),
        state_backend=StateBackendConfig(type="rocksdb", local_dir=str(local)),
        restart=FixedDelayRestart(attempts=3, delay=0.0),
    )
    src = EnumeratorFails(num_splits=2, records_per_split=10)
    p.source(src).deduplicate("id", within="1 min").sink(TwoPhaseCommitTestSink(str(tmp_path / "out")))
    with pytest.raises(JobFailedError, match="no broker reachable"):
        p.run(runtime="local", restore="none", control_endpoint=None)
    # four attempts, two RocksDB instances each: all closed and deleted in this (still running) process
    assert sorted(local.iterdir()) == [], sorted(local.iterdir())


class ReaderFails(GeneratorSource):
    """A source whose readers cannot be made (as a client that fails at once): its tasks are built after
    the deduplicating tasks, which had opened their RocksDB instances by then."""

    def create_reader(self, ctx: Any) -> Any:
        raise RuntimeError("reader not made (a test)")


def test_tasks_built_before_a_failure_in_building_the_others_release_their_rocksdb(tmp_path: Path) -> None:
    local = tmp_path / "local"
    p = Pipeline(
        "half-built",
        parallelism=2,
        checkpoint=CheckpointConfig(interval=1.0, storage=str(tmp_path / "chk")),
        state_backend=StateBackendConfig(type="rocksdb", local_dir=str(local)),
        restart=FixedDelayRestart(attempts=2, delay=0.0),
    )
    src = GeneratorSource(num_splits=2, records_per_split=10)
    p.source(src).deduplicate("id", within="1 min").sink(TwoPhaseCommitTestSink(str(tmp_path / "out")))
    broken = ReaderFails(num_splits=2, records_per_split=10)
    p.source(broken, name="broken").sink(TwoPhaseCommitTestSink(str(tmp_path / "out2"), name="sink2"))
    with pytest.raises(JobFailedError, match="reader not made"):
        p.run(runtime="local", restore="none", control_endpoint=None)
    # three attempts, each built both deduplicating tasks before the broken source's: all closed and deleted
    assert sorted(local.iterdir()) == [], sorted(local.iterdir())
