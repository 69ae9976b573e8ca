"""What a job reports of its keyed state: per checkpoint and task, the bytes its keyed state handles reference
and the bytes the checkpoint wrote; per operator that restored keyed state, how long the restore took."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from sluice import CheckpointConfig, KeyedProcessFunction, NoRestart, Pipeline, ValueStateDescriptor
from sluice.connectors.generator import GeneratorSource
from sluice.sinks.testing import TwoPhaseCommitTestSink

from tests.faults.shapes import BACKENDS


class Count(KeyedProcessFunction):
    """Counts a key's rows (the state stays: a restore has something to read)."""

    def open(self, ctx: Any) -> None:
        self.n = ValueStateDescriptor("n", 0, serializer="int64")

    def process(self, key: Any, rows: pa.RecordBatch, ctx: Any) -> None:
        st = ctx.state(self.n)
        st.update(st.value() + rows.num_rows)


def count_job(d: str, backend: dict[str, Any] | None) -> Pipeline:
    src = GeneratorSource(num_splits=1, records_per_split=600, batch_size=20, num_keys=7)
    p = Pipeline("counts", checkpoint=CheckpointConfig(interval=0.02, storage=f"{d}/chk"), restart=NoRestart(),
                 max_parallelism=16, state_backend=backend)  # fmt: skip
    p.source(src).key_by("key").process(Count(), parallelism=2).sink(TwoPhaseCommitTestSink(f"{d}/out"))
    return p


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_checkpoint_stats_count_keyed_bytes_and_a_restore_reports_its_duration(backend: str, tmp_path: Path) -> None:
    first = count_job(str(tmp_path), BACKENDS[backend]).run(runtime="local", restore="none")
    tasks = [t for c in first.checkpoints if c.status == "completed" for t in c.tasks.values() if t.get("keyed_bytes")]
    assert tasks, "no completed checkpoint with keyed state"
    for t in tasks:
        assert 0 < t["keyed_persisted_bytes"] <= t["keyed_bytes"]
        if backend == "hashmap":  # full snapshots inline in the task state file: all of it is written each time
            assert t["keyed_persisted_bytes"] == t["keyed_bytes"]
    assert not any("state_restore_s" in vm.get("gauges", {}) for vm in first.vertex_metrics.values())

    again = count_job(str(tmp_path), BACKENDS[backend]).run(runtime="local", restore="latest")
    restored = [vm["gauges"]["state_restore_s"] for vm in again.vertex_metrics.values() if "state_restore_s" in vm.get("gauges", {})]
    assert restored and all(s > 0 for s in restored)
