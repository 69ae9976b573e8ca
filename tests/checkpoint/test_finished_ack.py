"""A finished task's late acknowledgement: the coordinator took the task's final state for the checkpoint
already, so the shared files that upload wrote are deleted (no retained checkpoint will reference them),
while the files the final state references stay."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sluice import CheckpointConfig
from sluice.checkpoint.coordinator import CheckpointCoordinator, CoordinatedTasks, CoordinatorServices
from sluice.checkpoint.handles import AckResult
from sluice.checkpoint.storage import LocalCheckpointStorage
from sluice.graph import SubtaskId
from sluice.state.shared_registry import SharedStateRegistry

A, B = SubtaskId(0, 0), SubtaskId(1, 0)


class _Handle:
    def trigger_checkpoint(self, barrier: Any) -> None: ...
    def notify_checkpoint_complete(self, checkpoint_id: int) -> None: ...
    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None: ...


def test_a_late_acknowledgement_of_a_finished_task_has_its_new_shared_files_deleted(tmp_path: Path) -> None:
    storage = LocalCheckpointStorage(str(tmp_path), "job")
    c = CheckpointCoordinator(
        CheckpointConfig(interval=None, storage=str(tmp_path)),
        CoordinatedTasks({A: _Handle(), B: _Handle()}, {A}),
        CoordinatorServices(storage, {"job_id": "job"}),
    )
    c.store.shared = SharedStateRegistry()  # (no orphan sweep at stop: only the acknowledgement deletes)
    late = Path(storage.job_dir(), "shared", "b", "late.sst")
    late.parent.mkdir(parents=True)
    late.write_bytes(b"uploaded after the task finished")
    cid = c._try_trigger(forced=True)
    assert cid is not None
    c.task_finished(B)  # B acknowledges with its final state
    handle = {"path": "x", "size": 0, "committables": [], "shared": [["shared/b/late.sst", False]], "stats": {}}
    assert c.acknowledge(B, cid, handle) is AckResult.DUPLICATE
    c.stop()  # waits for the cleanup thread
    assert not late.exists()
