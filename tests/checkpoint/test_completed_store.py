"""The completed-checkpoint store on its own: retention, subsumption, discards, the index, and shared files
that outlive the checkpoint that uploaded them (issue 23)."""

from __future__ import annotations

from pathlib import Path

from sluice.checkpoint.completed_store import CompletedCheckpointStore, NoSharedState
from sluice.checkpoint.history import read_index
from sluice.checkpoint.storage import LocalCheckpointStorage
from sluice.checkpoint.storage_loader import checkpoint_storage
from sluice.state.shared_registry import SharedRef, SharedStateRegistry

from tests.checkpoint.storages import FlakyStorage


def complete(storage: LocalCheckpointStorage, cid: int, savepoint: bool = False) -> str:
    """A checkpoint folder with its metadata, as a coordinator leaves it; returns the folder."""
    return storage.write_metadata(cid, {"checkpoint_id": cid, "tasks": {}}, savepoint).rsplit("/", 1)[0]


def store_of(
    storage: LocalCheckpointStorage, retained: int = 2, restored: tuple[int, str] | None = None
) -> tuple[CompletedCheckpointStore, list[str]]:
    reported: list[str] = []
    return CompletedCheckpointStore(
        storage, retained, restored, lambda what, exc: reported.append(what)
    ), reported


def add(
    store: CompletedCheckpointStore,
    storage: LocalCheckpointStorage,
    cid: int,
    savepoint: bool = False,
    shared: tuple[str, ...] = (),
) -> None:
    store.add(cid, complete(storage, cid, savepoint), savepoint, shared)


def test_a_completed_checkpoint_subsumes_the_oldest_beyond_num_retained(tmp_path: Path) -> None:
    storage = checkpoint_storage(str(tmp_path), "job")
    store, reported = store_of(storage, retained=2)
    for cid in (1, 2, 3):
        add(store, storage, cid)
    store.close(10.0, sweep=False)
    assert [cid for cid, _ in store.completed] == [2, 3]
    assert [cid for cid, _, _ in storage.completed()] == [2, 3]  # checkpoint 1's folder is gone
    assert [e["id"] for e in (read_index(storage) or {})["checkpoints"]] == [2, 3]
    assert not reported


def test_savepoints_are_recorded_but_never_subsumed(tmp_path: Path) -> None:
    storage = checkpoint_storage(str(tmp_path), "job")
    store, _ = store_of(storage, retained=1)
    add(store, storage, 1, savepoint=True)
    add(store, storage, 2)
    add(store, storage, 3)
    store.close(10.0, sweep=False)
    assert [(cid, sp) for cid, _, sp in storage.completed()] == [(1, True), (3, False)]
    assert [(e["id"], e["kind"]) for e in (read_index(storage) or {})["checkpoints"]] == [
        (1, "savepoint"),
        (3, "checkpoint"),
    ]


def test_retention_goes_on_from_the_restored_checkpoint_and_never_deletes_one_kept_elsewhere(
    tmp_path: Path,
) -> None:
    storage = checkpoint_storage(str(tmp_path), "job")
    first, _ = store_of(storage, retained=3)
    for cid in (1, 2):
        add(first, storage, cid)
    first.close(10.0, sweep=False)
    # a later attempt restores checkpoint 2: checkpoint 1 (older, in the index) is subsumed in turn
    store, _ = store_of(storage, retained=2, restored=(2, storage.checkpoint_dir(2)))
    add(store, storage, 3)
    store.close(10.0, sweep=False)
    assert [cid for cid, _, _ in storage.completed()] == [2, 3]
    # a checkpoint restored from another place is retained, never deleted
    elsewhere = checkpoint_storage(str(tmp_path / "other"), "job")
    kept = complete(elsewhere, 7)
    store, _ = store_of(storage, retained=1, restored=(7, kept))
    add(store, storage, 8)
    store.close(10.0, sweep=False)
    assert [cid for cid, _, _ in elsewhere.completed()] == [7]


def test_a_discard_that_fails_is_reported_never_raised(tmp_path: Path) -> None:
    storage = FlakyStorage(str(tmp_path), "job")
    storage.retry_timeout = 0
    store, reported = store_of(storage, retained=1)
    add(store, storage, 1)
    storage.down.add("delete")
    add(store, storage, 2)  # subsumes 1: its discard fails
    store.discard(5, False)
    store.close(10.0, sweep=False)
    assert reported == ["discarding checkpoint 1", "discarding checkpoint 5"]


def test_a_shared_file_is_deleted_only_when_no_retained_checkpoint_references_it(tmp_path: Path) -> None:
    storage = checkpoint_storage(str(tmp_path), "job")
    shared = tmp_path / "job" / "shared"
    shared.mkdir(parents=True)
    for name in ("a.sst", "b.sst"):
        (shared / name).write_bytes(b"x")
    a, b = "shared/a.sst", "shared/b.sst"  # as handles name them: relative to the job's folder
    reported: list[str] = []
    registry = SharedStateRegistry()  # the registry of incremental checkpoints (issue 24)
    store = CompletedCheckpointStore(storage, 2, None, lambda what, exc: reported.append(what), registry)
    add(store, storage, 1, shared=(SharedRef(a),))
    add(store, storage, 2, shared=(SharedRef(a, placeholder=True), SharedRef(b)))  # reuses a, uploads b
    add(store, storage, 3, shared=(SharedRef(b, placeholder=True),))  # subsumes 1: 2 still references a
    store.close(10.0, sweep=False)
    assert sorted(p.name for p in shared.iterdir()) == ["a.sst", "b.sst"]
    add(store, storage, 4, shared=(SharedRef(b, placeholder=True),))  # subsumes 2: none references a
    store.close(10.0, sweep=False)
    assert sorted(p.name for p in shared.iterdir()) == ["b.sst"] and not reported


def test_full_checkpoints_share_nothing(tmp_path: Path) -> None:
    storage = checkpoint_storage(str(tmp_path), "job")
    store, _ = store_of(storage, retained=1)
    assert isinstance(store.shared, NoSharedState)
    add(store, storage, 1, shared=("ignored",))
    assert store.shared.unregister_unused(5) == []
