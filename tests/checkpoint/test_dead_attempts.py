"""What a killed process leaves in the checkpoint folder is deleted by the next attempt, at its start.

A process killed while it wrote checkpoint n leaves ``chk-n`` without ``_metadata``; its close, which sweeps
such folders, never ran. The long run of issue 39 found one such folder per few kills, kept forever.
"""

from __future__ import annotations

import time
from pathlib import Path

from sluice import CheckpointConfig, NoRestart, Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.sinks.testing import TwoPhaseCommitTestSink


def _job(tmp: Path) -> Pipeline:
    p = Pipeline(
        "dead-attempts",
        parallelism=1,
        restart=NoRestart(),
        checkpoint=CheckpointConfig(interval=0.1, storage=str(tmp / "chk")),
    )
    p.source(GeneratorSource(num_splits=1, records_per_split=10**9, batch_size=10, rows_per_second=500)).sink(
        TwoPhaseCommitTestSink(str(tmp / "out"))
    )
    return p


def _completed(client: object) -> int:
    return sum(s.status == "completed" for s in client.checkpoint_history)  # type: ignore[attr-defined]


def test_a_checkpoint_folder_a_killed_process_left_is_deleted_when_the_next_attempt_starts(
    tmp_path: Path,
) -> None:
    client = _job(tmp_path).start(runtime="local", restore="none")
    deadline = time.monotonic() + 120
    while _completed(client) < 2:
        assert client.running and time.monotonic() < deadline, "no checkpoint completed"
        time.sleep(0.05)
    client.cancel()
    job_dir = tmp_path / "chk" / "dead-attempts"
    newest = max(int(p.name.split("-")[1]) for p in job_dir.glob("chk-*"))
    # what a process killed in the middle of checkpoint newest + 1 leaves: task state, no metadata
    dead = job_dir / f"chk-{newest + 1}"
    dead.mkdir()
    (dead / "0-0.state").write_bytes(b"x" * 100)

    client = _job(tmp_path).start(runtime="local", restore="latest")
    try:
        # the attempt's own checkpoints start above every id the folder knows: dead's id is never reused
        deadline = time.monotonic() + 120
        while dead.exists():
            assert client.running, "the job ended"
            assert time.monotonic() < deadline, f"{dead.name} is still there while the job runs"
            time.sleep(0.05)
    finally:
        client.cancel()
