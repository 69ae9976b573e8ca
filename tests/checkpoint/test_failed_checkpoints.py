"""Committables survive checkpoints that fail while the job goes on (ARCHITECTURE.md section 6).

A checkpoint that expires or is declined, and that ``tolerable_failed_checkpoints`` lets the job survive,
must not drop what the sink pre-committed for it: those committables are committed with the next
checkpoint that completes (Flink keeps them in the sink's state, its CommittableCollector).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from sluice import CheckpointConfig, NoRestart, Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.sink import SinkContext, SinkWriter
from sluice.sinks.testing import TwoPhaseCommitTestSink, read_committed


class SlowPrepareOnce(TwoPhaseCommitTestSink):
    """Pre-commits slowly once (longer than the checkpoint timeout), so that checkpoint expires."""

    def __init__(self, directory: str, global_commit: bool, slow_s: float) -> None:
        super().__init__(directory, global_commit=global_commit)
        self.slow_s = slow_s
        self.slowed: list[int] = []

    def create_writer(self, ctx: SinkContext, restored: list[Any]) -> SinkWriter[str]:
        writer = super().create_writer(ctx, restored)
        prepare = writer.prepare_commit

        def slow_once(checkpoint_id: int) -> list[str]:
            comms = prepare(checkpoint_id)
            if comms and not self.slowed:
                self.slowed.append(checkpoint_id)
                time.sleep(self.slow_s)
            return comms

        writer.prepare_commit = slow_once  # type: ignore[method-assign]
        return writer


@pytest.mark.parametrize("global_commit", [True, False], ids=["global", "per-subtask"])
def test_expired_checkpoint_keeps_its_committables(tmp_path, global_commit: bool) -> None:
    src = GeneratorSource(num_splits=1, records_per_split=2000, batch_size=50, rows_per_second=2500)
    sink = SlowPrepareOnce(str(tmp_path / "out"), global_commit=global_commit, slow_s=0.6)
    p = Pipeline(
        "slow-prepare",
        checkpoint=CheckpointConfig(
            interval=0.1, timeout=0.3, tolerable_failed_checkpoints=3, storage=str(tmp_path / "chk")
        ),
        restart=NoRestart(),
    )
    p.source(src).sink(sink)
    result = p.run(runtime="local", restore="none")
    assert sink.slowed, "no pre-commit was slowed down"
    failed = [s for s in result.checkpoints if s.status == "failed"]
    assert any(s.failure_reason == "EXPIRED" for s in failed), [s.to_dict() for s in result.checkpoints]
    assert result.attempts == 1, "a tolerated failure must not restart the job"
    table = read_committed(str(tmp_path / "out"))
    ids = sorted(table.column("id").to_pylist()) if table is not None else []
    assert ids == list(range(2000)), f"{len(ids)} of 2000 rows committed"
