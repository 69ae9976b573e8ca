"""A pending checkpoint on its own: acknowledgements, and finalize -> the metadata written last (issue 23)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sluice.checkpoint.codec import MetadataCodec, from_metadata, read_commit_groups, verify_metadata
from sluice.checkpoint.handles import AckResult
from sluice.checkpoint.pending import FinalizeError, PendingCheckpoint
from sluice.checkpoint.storage import LocalCheckpointStorage
from sluice.checkpoint.storage_loader import checkpoint_storage
from sluice.errors import CheckpointError, CheckpointFailureReason
from sluice.events import AlignmentMode, CheckpointBarrier, CheckpointKind, CheckpointOptions
from sluice.graph import SubtaskId
from sluice.serializers import PickleSerializer
from sluice.sink import CommittableWithLineage

A, B = SubtaskId(0, 0), SubtaskId(1, 0)
KEY = b"k" * 32


def pending(cid: int = 3, kind: CheckpointKind = CheckpointKind.CHECKPOINT) -> PendingCheckpoint:
    barrier = CheckpointBarrier(cid, 1000.0, CheckpointOptions(kind, AlignmentMode.ALIGNED))
    return PendingCheckpoint(cid, barrier, {A, B})


def finalize(p: PendingCheckpoint, storage: Any, upto: int = 0, uncommitted: Any = None) -> Any:
    return p.finalize(storage, MetadataCodec(KEY), {"job_id": "job"}, upto, lambda: uncommitted or {})


def metadata(directory: str) -> dict[str, Any]:
    meta: dict[str, Any] = json.loads(Path(directory, "_metadata").read_text())
    verify_metadata(meta, KEY, "_metadata")
    return meta


def test_each_subtask_acknowledges_once_and_the_last_one_completes_it() -> None:
    p = pending()
    assert p.acknowledge(A, {"size": 1}) is AckResult.SUCCESS and not p.fully_acknowledged
    assert p.acknowledge(A, {"size": 2}) is AckResult.DUPLICATE and p.acks[A] == {"size": 1}
    assert p.acknowledge(SubtaskId(9, 9), {}) is AckResult.DUPLICATE  # not one it waits for
    assert p.acknowledge(B, {}) is AckResult.SUCCESS and p.fully_acknowledged


def test_finalize_writes_the_metadata_last_with_state_paths_relative_to_its_folder(tmp_path: Path) -> None:
    storage = checkpoint_storage(str(tmp_path), "job")
    p = pending()
    written = storage.write_task_state(3, "0-0.state", b"state of A")
    p.acknowledge(A, {"path": written, "size": 10})
    p.acknowledge(B, {"data": b"final state of B", "finished": True})  # a finished subtask: the driver writes
    done = finalize(p, storage)
    assert done.checkpoint_id == 3 and not done.savepoint and done.directory == storage.checkpoint_dir(3)
    meta = metadata(done.directory)
    assert meta["checkpoint_id"] == 3 and meta["job_id"] == "job" and meta["kind"] == "checkpoint"
    assert meta["tasks"][str(A)]["path"] == "0-0.state"
    assert meta["tasks"][str(B)]["path"] == "1-0.final.state" and "data" not in meta["tasks"][str(B)]
    assert Path(done.directory, "1-0.final.state").read_bytes() == b"final state of B"
    assert storage.completed() == [(3, done.directory, False)]


def test_a_savepoint_goes_to_its_own_folder(tmp_path: Path) -> None:
    storage = checkpoint_storage(str(tmp_path), "job")
    p = pending(5, CheckpointKind.SAVEPOINT)
    p.acknowledge(A, {})
    p.acknowledge(B, {})
    done = finalize(p, storage)
    assert done.savepoint and done.directory == storage.checkpoint_dir(5, savepoint=True)
    assert metadata(done.directory)["kind"] == "savepoint"


def test_committables_are_taken_once_and_follow_those_whose_commit_has_not_returned(tmp_path: Path) -> None:
    storage = checkpoint_storage(str(tmp_path), "job")
    p = pending(4)
    # checkpoint 2 completed already (its committable went to the queue); 3 failed: its committable comes again
    p.acknowledge(
        A,
        {
            "committables": [
                ("sink", CommittableWithLineage(2, "c2")),
                ("sink", CommittableWithLineage(3, "c3")),
            ]
        },
    )
    p.acknowledge(B, {"committables": [("sink", CommittableWithLineage(4, "c4"))]})
    done = finalize(p, storage, upto=2, uncommitted={"sink": [(2, ["c2"])]})
    assert done.committables == {"sink": ["c3", "c4"]}
    recorded = from_metadata(metadata(done.directory)["global_committables"]["sink"], "sink")
    assert read_commit_groups(recorded, PickleSerializer(), "sink") == [(2, ["c2"]), (4, ["c3", "c4"])]
    assert "committables" not in metadata(done.directory)["tasks"][str(A)]


class _MetadataFails(LocalCheckpointStorage):
    def write_atomic(self, path: str, data: bytes) -> None:
        raise OSError(28, "No space left on device", path)


def test_a_write_that_fails_raises_finalize_error_and_leaves_no_metadata(tmp_path: Path) -> None:
    storage = _MetadataFails(str(tmp_path), "job")
    storage.retry_timeout = 0
    p = pending()
    p.acknowledge(A, {})
    p.acknowledge(B, {})
    with pytest.raises(FinalizeError, match="No space left on device"):
        finalize(p, storage)
    assert storage.completed() == []


def test_an_abort_wakes_whoever_waits_with_its_error() -> None:
    p = pending()
    error = CheckpointError(CheckpointFailureReason.EXPIRED, "too slow", 3)
    p.abort(error)
    assert p.done.is_set() and p.error is error
