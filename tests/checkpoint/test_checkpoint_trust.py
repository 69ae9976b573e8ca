"""Checkpoint storage is data, not code (issue 22): whoever can write it cannot run code on a restore.

A restore used to unpickle ``.state`` files and base64 pickles inside ``_metadata``: a planted file ran
``os.system`` as root. Now every file is signed with the job's checkpoint key and verified before a byte of
it is decoded; framework data is JSON / Arrow IPC / raw bytes, and the only pickles left (user state) are
inside signed files. Each test plants a pickle that would create a marker file when loaded: the marker
never appears, and the restore fails with one line naming the file.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sluice import CheckpointConfig, NoRestart, Pipeline, RestoreError
from sluice.checkpoint.payload import decode_task_state, encode_task_state
from sluice.connectors.generator import GeneratorSource
from sluice.serializers import plain
from sluice.sinks.testing import TwoPhaseCommitTestSink, read_committed
from sluice.testing.faults import FaultInjector

from tests.faults.shapes import RunningCount, rows_of, with_key

KEY = "trust-test-key-0123456789abcdef"
ATTACKER_KEY = b"the-attackers-own-key-0123456789"


class Planted:
    """Loading this pickle creates ``marker`` (what an attacker's payload would do, harmlessly)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker, "w"))


def build(tmp: Path, key: str = KEY) -> Pipeline:
    p = Pipeline(
        "trust",
        parallelism=2,
        checkpoint=CheckpointConfig(interval=0.05, storage=str(tmp / "chk"), key=key),
        restart=NoRestart(),
    )
    src = GeneratorSource(num_splits=2, records_per_split=600, batch_size=20, rows_per_second=1500)
    counted = p.source(src).map_batches(with_key, name="with-key").key_by("k").process(RunningCount(), name="counter")
    counted.sink(TwoPhaseCommitTestSink(str(tmp / "out")), name="files")
    counted.sink(TwoPhaseCommitTestSink(str(tmp / "table"), global_commit=True), name="table")
    return p


@pytest.fixture
def crashed(tmp_path: Path) -> tuple[Path, Path]:
    """A job that crashed midway, and its latest checkpoint: enumerator state, splits, keyed state, timers,
    pending committables (per-subtask sink) and global committables (in ``_metadata``). (State files are
    named by absolute path in ``_metadata``, so each test crashes a job of its own instead of copying one.)"""
    tmp = tmp_path / "job"
    faults = FaultInjector(point="complete_to_commit", after=3)
    with pytest.raises(Exception, match="injected fault"):
        build(tmp).run(runtime="local", faults=faults, restore="none")
    assert faults.fired
    job = next((tmp / "chk").iterdir())
    latest = max((d for d in job.iterdir() if d.name.startswith("chk-")), key=lambda d: int(d.name[4:]))
    return tmp, latest


def restore_fails(tmp: Path, latest: Path, naming: Path | str, key: str = KEY) -> str:
    """Restore ``latest`` and return the RestoreError's message (one line naming ``naming``)."""
    with pytest.raises(RestoreError) as info:
        build(tmp, key).run(runtime="local", restore=str(latest))
    text = str(info.value)
    assert "\n" not in text and str(naming) in text, text
    return text


def state_file(latest: Path, operator: str) -> tuple[Path, dict[str, Any]]:
    """A task state file holding ``operator``'s state, decoded with the job's key."""
    for f in sorted(latest.glob("*.state")):
        payload = decode_task_state(f.read_bytes(), KEY.encode(), str(f))
        if operator in payload["operators"]:
            return f, payload
    raise AssertionError(f"no state file holds {operator!r}")


def test_the_unmodified_checkpoint_restores(crashed: tuple[Path, Path], tmp_path: Path) -> None:
    tmp, latest = crashed
    assert build(tmp).run(runtime="local", restore=str(latest)).status == "finished"
    expected = build(tmp_path / "ref").run(runtime="local", restore="none")
    assert expected.status == "finished"
    assert rows_of(read_committed(str(tmp / "out"))) == rows_of(read_committed(str(tmp_path / "ref" / "out")))


def test_a_planted_state_file_does_not_run(crashed: tuple[Path, Path], tmp_path: Path) -> None:
    tmp, latest = crashed
    marker = tmp_path / "pwned"
    victim, _ = state_file(latest, "counter")
    victim.write_bytes(pickle.dumps(Planted(marker), protocol=5))  # what the old format would have loaded
    text = restore_fails(tmp, latest, victim)
    assert "is a pickle, not a sluice state file" in text
    assert not marker.exists()


def test_a_state_file_signed_with_another_key_does_not_run(crashed: tuple[Path, Path], tmp_path: Path) -> None:
    """The attacker writes a well-formed state file whose keyed state and pending committables are pickles,
    signed with a key of their own: refused before any section is read."""
    tmp, latest = crashed
    marker = tmp_path / "pwned"
    victim, payload = state_file(latest, "files")
    payload["operators"]["files"]["operator"]["pending"] = [[1, [{"v": 1, "data": pickle.dumps(Planted(marker))}]]]
    for op in payload["operators"].values():
        op["keyed"] = {0: pickle.dumps(Planted(marker))}
    victim.write_bytes(encode_task_state(payload, ATTACKER_KEY))
    text = restore_fails(tmp, latest, victim)
    assert "does not verify with this job's checkpoint key" in text
    assert not marker.exists()


def test_a_modified_state_file_is_refused(crashed: tuple[Path, Path], tmp_path: Path) -> None:
    tmp, latest = crashed
    victim, _ = state_file(latest, "counter")
    data = bytearray(victim.read_bytes())
    data[-40] ^= 0x01  # inside the last section, before the HMAC
    victim.write_bytes(bytes(data))
    assert "failed authentication" in restore_fails(tmp, latest, victim)


def _rewrite_metadata(latest: Path, change: Any) -> Path:
    path = latest / "_metadata"
    meta = json.loads(path.read_text())
    change(meta)
    path.write_text(json.dumps(meta))
    return path


def test_a_planted_enumerator_state_does_not_run(crashed: tuple[Path, Path], tmp_path: Path) -> None:
    tmp, latest = crashed
    marker = tmp_path / "pwned"
    blob = pickle.dumps(Planted(marker))

    def plant(meta: dict[str, Any]) -> None:
        (uid,) = meta["enumerators"]
        meta["enumerators"][uid] = plain.encode({"v": 1, "data": blob})

    path = _rewrite_metadata(latest, plant)
    assert "failed authentication" in restore_fails(tmp, latest, path)
    assert not marker.exists()
    # the old format's base64 pickle, signature removed: refused as unsigned
    _rewrite_metadata(latest, lambda m: m.update(enumerators={"generator": base64.b64encode(blob).decode()}, mac=None))
    assert "is not signed" in restore_fails(tmp, latest, path)
    assert not marker.exists()


def test_planted_global_committables_do_not_run(crashed: tuple[Path, Path], tmp_path: Path) -> None:
    tmp, latest = crashed
    marker = tmp_path / "pwned"
    evil = plain.encode([[1, [{"v": 1, "data": pickle.dumps(Planted(marker))}]]])
    path = _rewrite_metadata(latest, lambda m: m["global_committables"].update(table=evil))
    assert "failed authentication" in restore_fails(tmp, latest, path)
    assert not marker.exists()


def test_a_checkpoint_restores_only_with_its_key(crashed: tuple[Path, Path], tmp_path: Path) -> None:
    tmp, latest = crashed
    text = restore_fails(tmp, latest, latest / "_metadata", key="some-other-key-0123456789abcdef")
    assert "does not verify with this job's checkpoint key" in text and "CheckpointConfig.key" in text
    assert KEY not in text


def test_a_checkpoint_of_the_pickle_format_is_refused_clearly(crashed: tuple[Path, Path], tmp_path: Path) -> None:
    """What sluice wrote before: ``_metadata`` without a signature, pickled state files."""
    tmp, latest = crashed
    marker = tmp_path / "pwned"
    for f in latest.glob("*.state"):
        f.write_bytes(pickle.dumps({"operators": {}, "splits": Planted(marker)}, protocol=5))

    def old(meta: dict[str, Any]) -> None:
        for k in ("mac", "format", "key_id"):
            meta.pop(k)
        meta["enumerators"] = {u: base64.b64encode(pickle.dumps([])).decode() for u in meta["enumerators"]}
        meta["global_committables"] = base64.b64encode(pickle.dumps({})).decode()

    path = _rewrite_metadata(latest, old)
    text = restore_fails(tmp, latest, path)
    assert "written before sluice authenticated its checkpoints" in text and "--restore none" in text
    assert not marker.exists()


def test_the_cli_prints_one_line_and_runs_nothing(crashed: tuple[Path, Path], tmp_path: Path) -> None:
    tmp, latest = crashed
    marker = tmp_path / "pwned"
    victim, _ = state_file(latest, "counter")
    victim.write_bytes(pickle.dumps(Planted(marker), protocol=5))
    job = tmp_path / "job.py"
    job.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})\n"
        "from pathlib import Path\n"
        "from tests.checkpoint.test_checkpoint_trust import build\n"
        f"pipeline = build(Path({str(tmp)!r}))\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "sluice.cli", "run", str(job), "--runtime", "local", "--restore", str(latest),
         "--control-endpoint", "none"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert r.returncode == 1, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and str(victim) in errors[0] and "Traceback" not in r.stderr, r.stderr
    assert not marker.exists()


@pytest.mark.parametrize("garbage", [b"\x80\x05not json", b"[1, 2]", b'{"checkpoint_id": "x"}'])
def test_garbage_metadata_is_refused_by_name(crashed: tuple[Path, Path], garbage: bytes) -> None:
    tmp, latest = crashed
    (latest / "_metadata").write_bytes(garbage)
    restore_fails(tmp, latest, latest / "_metadata")
