"""Local recovery: a restart on the same host restores from the local copy of the last completed checkpoint,
each file checked against the handle's SHA-256; a corrupt or missing local copy (or another host) falls
back to checkpoint storage; local copies of subsumed checkpoints are deleted."""

from __future__ import annotations

import logging
import random
import threading
from pathlib import Path
from typing import Any

import pytest
from sluice.errors import RestoreError
from sluice.state.handles import handle_files
from sluice.state.spi import Handle
from sluice.state.transfer import LocalFileTransfer

from tests.state.conftest import MakeBackend
from tests.state.harness import Model, dump, random_op

VARIANTS = [
    pytest.param("rocksdb", {"incremental": True}, id="rocksdb-incremental"),
    pytest.param("rocksdb", {"incremental": False}, id="rocksdb-full"),
    pytest.param("rocksdb", {"changelog": True}, id="rocksdb-changelog"),
    pytest.param("hashmap", {"changelog": True}, id="hashmap-changelog"),
]


def run(make_backend: MakeBackend, kind: str, options: dict[str, Any], checkpoints: int = 4) -> tuple[Any, Handle, Model]:
    """A subtask with local recovery: random changes, completed checkpoints (a materialization on the way
    with changelog); the backend, its last handle and the state at it."""
    rng = random.Random(f"{kind}-{options}")
    be: Any = make_backend(kind, local_recovery=True, **options)
    model, handle = Model(), None
    for cid in range(1, checkpoints + 1):
        for _ in range(80):
            random_op(be, model, rng)
        if options.get("changelog") and cid == 2:
            be.materialize().result()
        handle = be.snapshot(cid).run()
        be.notify_checkpoint_complete(cid)
    assert handle is not None
    return be, handle, model


def files(handle: Handle) -> list[str]:
    return sorted({ref.path for ref, _ in handle_files(handle)})


@pytest.mark.parametrize(("kind", "options"), VARIANTS)
def test_a_restart_on_the_same_host_restores_from_the_local_copy(
    kind: str, options: dict[str, Any], make_backend: MakeBackend, storage: LocalFileTransfer
) -> None:
    old, handle, model = run(make_backend, kind, options)
    old.dispose()
    for path in files(handle):  # only the local copies are left: the restore can only have used them
        storage.delete(path)
    restarted: Any = make_backend(kind, local_recovery=True, **options)
    restarted.restore([handle])
    assert dump(restarted) == model
    assert (restarted.store.used, restarted.store.missing, restarted.store.refused) == (len(files(handle)), 0, 0)


@pytest.mark.parametrize(("kind", "options"), VARIANTS)
def test_a_corrupt_local_copy_is_refused_and_checkpoint_storage_read_instead(
    kind: str, options: dict[str, Any], make_backend: MakeBackend, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sluice")
    old, handle, model = run(make_backend, kind, options)
    # the biggest SST file or segment: a hard link in the store, as RocksDB and the changelog wrote it
    biggest = max(handle_files(handle), key=lambda f: (f[0].path.endswith((".sst", ".arrows")), f[0].size))[0].path
    old.dispose()
    local = Path(old.store.root) / biggest
    data = bytearray(local.read_bytes())
    data[len(data) // 2] ^= 0xFF
    local.write_bytes(bytes(data))
    restarted: Any = make_backend(kind, local_recovery=True, **options)
    restarted.restore([handle])
    assert dump(restarted) == model
    assert (restarted.store.used, restarted.store.refused) == (len(files(handle)) - 1, 1)
    assert biggest in caplog.text and "does not match its checkpoint's SHA-256" in caplog.text
    assert not local.exists()  # a refused local copy is deleted


@pytest.mark.parametrize(("kind", "options"), VARIANTS)
def test_a_missing_local_copy_is_read_from_checkpoint_storage(
    kind: str, options: dict[str, Any], make_backend: MakeBackend
) -> None:
    old, handle, model = run(make_backend, kind, options)
    gone = files(handle)[0]
    (Path(old.store.root) / gone).unlink()
    old.dispose()
    restarted: Any = make_backend(kind, local_recovery=True, **options)
    restarted.restore([handle])
    assert dump(restarted) == model
    assert (restarted.store.used, restarted.store.missing, restarted.store.refused) == (len(files(handle)) - 1, 1, 0)


@pytest.mark.parametrize(("kind", "options"), VARIANTS)
def test_a_restart_on_another_host_reads_checkpoint_storage(
    kind: str, options: dict[str, Any], make_backend: MakeBackend, tmp_path: Path
) -> None:
    old, handle, model = run(make_backend, kind, options)
    old.dispose()
    elsewhere: Any = make_backend(kind, local_recovery=True, local_dir=str(tmp_path / "other-host"), **options)
    elsewhere.restore([handle])
    assert dump(elsewhere) == model
    assert (elsewhere.store.used, elsewhere.store.missing) == (0, len(files(handle)))


def test_a_restore_fails_when_neither_copy_matches_the_handle(make_backend: MakeBackend, storage: LocalFileTransfer) -> None:
    old, handle, _ = run(make_backend, "rocksdb", {"incremental": True})
    path = files(handle)[0]
    for copy in (Path(old.store.root) / path, storage.root / path):
        copy.write_bytes(b"not the checkpointed bytes")
    old.dispose()
    with pytest.raises(RestoreError, match="does not match its checkpoint's SHA-256") as info:
        make_backend("rocksdb", local_recovery=True, incremental=True).restore([handle])
    assert path in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(("kind", "options"), VARIANTS)
def test_local_copies_of_subsumed_checkpoints_are_deleted(
    kind: str, options: dict[str, Any], make_backend: MakeBackend
) -> None:
    rng = random.Random(kind)
    be: Any = make_backend(kind, local_recovery=True, **options)
    model = Model()
    for cid in range(1, 8):
        for _ in range(60):
            random_op(be, model, rng)
        handle = be.snapshot(cid).run()
        be.notify_checkpoint_complete(cid)
        assert be.store.files() == files(handle)  # exactly the last completed checkpoint's files


@pytest.mark.parametrize("kind", ["hashmap", "rocksdb"])
def test_a_materialization_under_way_keeps_its_local_copies(
    kind: str, make_backend: MakeBackend, storage: LocalFileTransfer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint that completes while a materialization uploads does not delete the local copies of
    what it uploaded so far: the next checkpoint references them."""
    rng = random.Random(kind)
    be: Any = make_backend(kind, local_recovery=True, changelog=True)
    model = Model()
    for _ in range(200):
        random_op(be, model, rng)
    be.snapshot(1).run()
    be.notify_checkpoint_complete(1)
    gate, first_done = threading.Event(), threading.Event()
    upload = storage.upload

    def gated(local_path: str, remote_path: str) -> None:
        if threading.current_thread().name.startswith("sluice-materialize") and first_done.is_set():
            assert gate.wait(60), "the test never opened the gate"
        upload(local_path, remote_path)

    monkeypatch.setattr(storage, "upload", gated)
    monkeypatch.setattr(be.store, "put", _after(be.store.put, first_done))
    future = be.materialize()
    try:
        assert first_done.wait(60)  # one file of the materialization is uploaded and kept locally
        kept = set(be.store.files())
        random_op(be, model, rng)
        second = be.snapshot(2).run()  # the materialization is not ready: the old base
        be.notify_checkpoint_complete(2)
        assert kept <= set(be.store.files())
    finally:
        gate.set()
    future.result()
    third = be.snapshot(3).run()
    be.notify_checkpoint_complete(3)
    assert second["base"] is None and third["base"] is not None
    assert be.store.files() == files(third)
    be.dispose()
    restarted: Any = make_backend(kind, local_recovery=True, changelog=True)
    restarted.restore([third])
    assert dump(restarted) == model and restarted.store.used == len(files(third))


def _after(put: Any, event: threading.Event) -> Any:
    def wrapped(local_path: str, remote_path: str) -> None:
        put(local_path, remote_path)
        if threading.current_thread().name.startswith("sluice-materialize"):
            event.set()

    return wrapped
