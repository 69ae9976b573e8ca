"""Checkpoint storage is checked at start (issue 21, point 6): storage that cannot be written is refused
at once, as one line naming the location, before any attempt (no restart is spent)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from sluice import CheckpointConfig, FixedDelayRestart, Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.errors import StorageError, is_recoverable
from sluice.sinks.testing import TwoPhaseCommitTestSink

from tests.sinks.conftest import MotoS3


def job(storage: str, out: Path, **options: object) -> Pipeline:
    p = Pipeline(
        "probe",
        checkpoint=CheckpointConfig(interval=0.1, storage=storage, storage_options=dict(options)),
        restart=FixedDelayRestart(attempts=5, delay=1.0),
    )
    p.source(GeneratorSource(num_splits=1, records_per_split=100)).sink(TwoPhaseCommitTestSink(str(out)))
    return p


def refused(p: Pipeline, location: str) -> StorageError:
    with pytest.raises(StorageError) as ei:
        p.start(runtime="local", restore="none")  # with its control endpoint, as `sluice run` starts it
    text = str(ei.value)
    assert "\n" not in text and f"checkpoint storage {location} is not writable" in text, text
    assert not is_recoverable(ei.value)
    return ei.value


def test_a_location_under_a_regular_file_is_refused_at_start(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a folder")
    error = refused(job(str(tmp_path / "a-file" / "chk"), tmp_path / "out"), str(tmp_path / "a-file" / "chk"))
    assert "Not a directory" in str(error)


def test_a_read_only_file_system_is_refused_at_start(tmp_path: Path, tmpfs: Callable[..., Path]) -> None:
    ro = tmpfs(size="1m", ro=True)
    error = refused(job(str(ro / "chk"), tmp_path / "out"), str(ro / "chk"))
    assert "Read-only file system" in str(error)


@pytest.mark.s3
def test_a_missing_bucket_is_refused_at_start(tmp_path: Path, moto_s3: MotoS3) -> None:
    refused(job("s3://no-such-bucket-here/chk", tmp_path / "out", **moto_s3.options()), "s3://no-such-bucket-here/chk")


JOB = """
from sluice import CheckpointConfig, FixedDelayRestart, Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.sinks.testing import TwoPhaseCommitTestSink

pipeline = Pipeline("probe", checkpoint=CheckpointConfig(interval=0.1, storage={chk!r}),
                    restart=FixedDelayRestart(attempts=5, delay=1.0))
pipeline.source(GeneratorSource(num_splits=1, records_per_split=100)).sink(TwoPhaseCommitTestSink({out!r}))
"""


@pytest.mark.parametrize("runtime", ["local", "spark"])
def test_sluice_run_prints_one_line(tmp_path: Path, runtime: str) -> None:
    (tmp_path / "a-file").write_text("not a folder")
    chk = str(tmp_path / "a-file" / "chk")
    (tmp_path / "job.py").write_text(textwrap.dedent(JOB.format(chk=chk, out=str(tmp_path / "out"))))
    cmd = [sys.executable, "-m", "sluice.cli", "run", str(tmp_path / "job.py"), "--runtime", runtime]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"Error: checkpoint storage {chk} is not writable"), r.stderr
