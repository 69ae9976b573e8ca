"""What a job reports of its keyed state: per checkpoint and task, the bytes its keyed state handles reference
and the bytes the checkpoint wrote; per operator that restored keyed state, how long the restore took."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults.shapes import BACKENDS
from tests.state.test_jobs import sessions_job


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_checkpoint_stats_count_keyed_bytes_and_a_restore_reports_its_duration(backend: str, tmp_path: Path) -> None:
    first = sessions_job(str(tmp_path), BACKENDS[backend]).run(runtime="local", restore="none")
    tasks = [t for c in first.checkpoints if c.status == "completed" for t in c.tasks.values() if t.get("keyed_bytes")]
    assert tasks, "no completed checkpoint with keyed state"
    for t in tasks:
        assert 0 < t["keyed_persisted_bytes"] <= t["keyed_bytes"]
        if backend == "hashmap":  # full snapshots inline in the task state file: all of it is written each time
            assert t["keyed_persisted_bytes"] == t["keyed_bytes"]
    assert not any("state_restore_s" in vm.get("gauges", {}) for vm in first.vertex_metrics.values())

    again = sessions_job(str(tmp_path), BACKENDS[backend]).run(runtime="local", restore="latest")
    restored = [vm["gauges"]["state_restore_s"] for vm in again.vertex_metrics.values() if "state_restore_s" in vm.get("gauges", {})]
    assert restored and all(s > 0 for s in restored)
