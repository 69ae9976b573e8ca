"""Local recovery inside jobs (issue 24 point 5): a restart on the same host restores keyed state from the
local copy of the last completed checkpoint (the job's metrics count the files taken from it), and a restart
after the local copy was corrupted or deleted reads checkpoint storage instead; the output stays exactly
once (equal to the output computed from the input in plain Python, tests/faults/expected.py)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from sluice.testing.faults import FaultInjector

from tests.faults.shapes import SHAPE, record, run_shape
from tests.faults.test_exactly_once import check_exactly_once, reference

#: the backends with local copies (the hashmap backend without changelog keeps its state inline)
LOCAL = ("rocksdb+local", "rocksdb+changelog+local", "hashmap+changelog+local")
SEED = 11
LOCAL_FILES = "state.local_recovery.files_local"
REMOTE_FILES = "state.local_recovery.files_remote"
REFUSED = "state.local_recovery.files_refused"


@pytest.mark.parametrize("backend", LOCAL)
def test_an_in_process_restart_restores_from_the_local_copy(backend: str, tmp_path: Path) -> None:
    expected = reference("keyed", SEED)
    faults = FaultInjector(point="complete_to_commit", after=1)  # after two completed checkpoints
    run = run_shape(SHAPE["keyed"], SEED, faults, scale=2, directory=str(tmp_path), backend=backend)
    label = f"{backend}: fired={faults.fired}"
    record("local-recovery", 0, "keyed", "aligned", faults.all_fired, faults.crashes, run.rows, expected, backend=backend)
    assert run.error is None and run.result is not None and faults.all_fired, f"{label}: {run.error}"
    assert run.result.attempts == 2, label
    metrics = run.result.metrics
    assert metrics.get(LOCAL_FILES, 0) > 0, f"{label}: no file was restored from the local copy ({metrics})"
    assert metrics.get(REMOTE_FILES) == 0 and metrics.get(REFUSED) == 0, f"{label}: {metrics}"
    check_exactly_once(label, run.rows, expected)


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes() or b"\0")  # an empty file (RocksDB's empty WAL) gets a byte
    data[len(data) // 2] ^= 0xFF
    path.unlink()  # a local copy may be a hard link to a file RocksDB or checkpoint storage also holds
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["corrupt", "delete"])
@pytest.mark.parametrize("backend", LOCAL)
def test_a_restart_after_the_local_copy_is_damaged_reads_checkpoint_storage(
    backend: str, damage: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The first run crashes (no restart) after checkpoints completed; every local copy is then changed (a byte
    flipped) or deleted; a restart on the same host restores the latest checkpoint from checkpoint storage."""
    caplog.set_level(logging.WARNING, logger="sluice")
    expected = reference("keyed", SEED)
    faults = FaultInjector(point="complete_to_commit", after=2)
    kw = {"scale": 2, "directory": str(tmp_path), "backend": backend}
    first = run_shape(SHAPE["keyed"], SEED, faults, attempts=0, **kw)  # type: ignore[arg-type]
    assert first.error is not None and faults.all_fired, f"{backend}: the first run did not crash"
    copies = [p for p in (tmp_path / "local").rglob("*") if p.is_file()]
    assert copies, f"{backend}: no local copies were kept"
    if damage == "corrupt":
        for p in copies:
            _flip_a_byte(p)
    else:
        shutil.rmtree(tmp_path / "local")
    second = run_shape(SHAPE["keyed"], SEED, None, restore="latest", **kw)  # type: ignore[arg-type]
    label = f"{backend} {damage}"
    record("local-recovery", 1, "keyed", "aligned", True, 1, second.rows, expected, backend=backend)
    assert second.error is None and second.result is not None, f"{label}: {second.error}"
    metrics = second.result.metrics
    assert metrics.get(LOCAL_FILES) == 0 and metrics.get(REMOTE_FILES, 0) > 0, f"{label}: {metrics}"
    if damage == "corrupt":
        assert metrics[REFUSED] == metrics[REMOTE_FILES], f"{label}: {metrics}"
        assert "does not match its checkpoint's SHA-256" in caplog.text
    else:
        assert metrics[REFUSED] == 0, f"{label}: {metrics}"
    check_exactly_once(label, second.rows, expected)
