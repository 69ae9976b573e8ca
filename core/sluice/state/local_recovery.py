"""Local recovery: each subtask keeps a local copy of its last completed checkpoint's files, and a restart on
the same host restores from them, each checked against the remote handle's SHA-256 (Flink's local
recovery, ``state.backend.local-recovery``).

* :class:`LocalRecoveryTransfer` wraps the job's :class:`~sluice.state.transfer.FileTransfer`: every file
  uploaded is also kept in a :class:`LocalStateStore` (a hard link for immutable files: RocksDB's SST files,
  changelog segments and canonical files; a copy otherwise), under its remote path.
* A restore asks it first (:func:`~sluice.state.transfer.download_verified`): a local copy whose SHA-256
  is the handle's is used; one that is missing or differs (corrupt, another job's, another host) is not,
  and the file comes from checkpoint storage.
* :class:`LocalRecoveryKeyedStateBackend` deletes local copies once a later checkpoint completed without
  them: kept are the files of the last completed checkpoint, files uploaded since its snapshot began (later
  checkpoints), and a changelog materialization's files until it is confirmed.

The store lives under ``taskmanager.state.local.root-dirs`` (``local_recovery_dir``), else
``state.backend.rocksdb.localdir``, else the system's temporary folder, in a folder per checkpoint storage
location and subtask, so it outlives the keyed backend: an in-process restart (or a Spark executor that
stays alive) finds it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sluice.state.delegating import DelegatingKeyedStateBackend
from sluice.state.handles import handle_files
from sluice.state.spi import Handle, KeyedStateBackend, StateSnapshot
from sluice.state.transfer import FileRef, FileTransfer, new_mark, sha256_file, transfer_location

if TYPE_CHECKING:
    from sluice.state.config import StateBackendConfig

__all__ = [
    "LocalRecoveryKeyedStateBackend",
    "LocalRecoveryTransfer",
    "LocalStateStore",
    "local_recovery_root",
]

log = logging.getLogger("sluice.state")

#: files that are never changed once written: a local copy may be a hard link
_IMMUTABLE = (".sst", ".arrows")


def local_recovery_root(config: StateBackendConfig, owner: str, transfer: FileTransfer) -> str:
    """The folder of ``owner``'s local copies for checkpoints stored through ``transfer``."""
    base = config.local_recovery_dir or config.local_dir or os.path.join(tempfile.gettempdir(), "sluice-local")
    scope = hashlib.sha256(transfer_location(transfer).encode()).hexdigest()[:16]
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in owner)
    return os.path.join(base, "local-recovery", scope, safe)


def _place(source: str | Path, target: str | Path) -> None:
    if str(target).endswith(_IMMUTABLE):
        try:
            os.link(source, target)
            return
        except OSError:
            pass  # another file system: copy
    shutil.copyfile(source, target)


class LocalStateStore:
    """Local copies of a subtask's uploaded files, by remote path.

    Attributes:
        root: its folder.
        used: local copies a restore used.
        missing: files a restore found no local copy of.
        refused: local copies a restore refused (their SHA-256 differed from the handle's); they are deleted.
    """

    def __init__(self, root: str) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # remote path -> mark of its upload; copies found on disk (an earlier run's) are the oldest
        self._marks = {str(p.relative_to(self.root)): 0 for p in self.root.rglob("*") if p.is_file() and not p.name.startswith(".")}
        self.used = self.missing = self.refused = 0

    def _path(self, remote_path: str) -> Path:
        p = (self.root / remote_path).resolve()
        if not p.is_relative_to(self.root.resolve()):
            raise ValueError(f"{remote_path!r} leaves the local recovery folder")
        return p

    def put(self, local_path: str, remote_path: str) -> None:
        """Keep a copy of ``local_path``, which was uploaded to ``remote_path``."""
        target = self._path(remote_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}")
        try:
            _place(local_path, tmp)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        with self._lock:
            self._marks[remote_path] = new_mark()

    def fetch(self, ref: FileRef, local_path: str) -> bool:
        """Place the local copy of ``ref`` at ``local_path`` if it has the handle's SHA-256."""
        source = self._path(ref.path)
        if not source.is_file():
            self.missing += 1
            return False
        tmp = f"{local_path}.{uuid.uuid4().hex[:8]}.local"
        try:
            _place(source, tmp)
            if os.path.getsize(tmp) == ref.size and sha256_file(tmp) == ref.sha256:
                os.replace(tmp, local_path)
                self.used += 1
                return True
        except OSError as exc:
            log.warning("local copy of state file %s is unreadable (%s); reading checkpoint storage", ref.path, exc)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        log.warning("local copy of state file %s does not match its checkpoint's SHA-256: it is deleted and the file is read from checkpoint storage", ref.path)
        self.refused += 1
        self._forget([ref.path])
        return False

    def retain(self, keep: set[str], floor: int) -> list[str]:
        """Delete the copies not in ``keep`` that were uploaded before mark ``floor``; the deleted paths."""
        with self._lock:
            gone = sorted(p for p, mark in self._marks.items() if p not in keep and mark < floor)
        self._forget(gone)
        return gone

    def _forget(self, paths: list[str]) -> None:
        for p in paths:
            with self._lock:
                self._marks.pop(p, None)
            target = self._path(p)
            target.unlink(missing_ok=True)
            for parent in target.parents:  # drop folders left empty
                if parent == self.root or not parent.is_relative_to(self.root):
                    break
                try:
                    parent.rmdir()
                except OSError:
                    break

    def files(self) -> list[str]:
        """The remote paths that have a local copy."""
        with self._lock:
            return sorted(self._marks)


class LocalRecoveryTransfer:
    """A :class:`~sluice.state.transfer.FileTransfer` that keeps a local copy of every upload and offers
    verified local copies to restores."""

    def __init__(self, remote: FileTransfer, store: LocalStateStore) -> None:
        self.remote = remote
        self.store = store

    @property
    def location(self) -> str:
        """The remote transfer's location."""
        return transfer_location(self.remote)

    def upload(self, local_path: str, remote_path: str) -> None:
        self.remote.upload(local_path, remote_path)
        try:
            self.store.put(local_path, remote_path)
        except OSError as exc:  # a local copy is an optimization: never fail a checkpoint for it
            log.warning("no local copy of state file %s kept: %s", remote_path, exc)

    def download(self, remote_path: str, local_path: str) -> None:
        self.remote.download(remote_path, local_path)

    def delete(self, remote_path: str) -> None:
        self.remote.delete(remote_path)

    def exists(self, remote_path: str) -> bool:
        return self.remote.exists(remote_path)

    def list(self, prefix: str) -> list[str]:
        return self.remote.list(prefix)

    def local_copy(self, ref: FileRef, local_path: str) -> bool:
        """Place a verified local copy of ``ref`` at ``local_path``; False if there is none."""
        return self.store.fetch(ref, local_path)


class _RecordingSnapshot(StateSnapshot):
    def __init__(self, inner: StateSnapshot, backend: LocalRecoveryKeyedStateBackend, checkpoint_id: int, mark: int) -> None:
        self._inner, self._be, self._cid, self._mark = inner, backend, checkpoint_id, mark

    def run(self) -> Handle:
        handle = self._inner.run()
        self._be.record(self._cid, handle, self._mark)
        return handle

    def discard(self) -> None:
        self._inner.discard()


class LocalRecoveryKeyedStateBackend(DelegatingKeyedStateBackend):
    """Keeps the local copies of the last completed checkpoint (and of what may become the next one)."""

    def __init__(self, delegate: KeyedStateBackend, store: LocalStateStore) -> None:
        super().__init__(delegate)
        self.store = store
        self._lock = threading.Lock()
        self._records: dict[int, tuple[set[str], int]] = {}
        self._restored: dict[str, int] = {}

    def snapshot(self, checkpoint_id: int, savepoint: bool = False) -> StateSnapshot:
        snap = self.delegate.snapshot(checkpoint_id, savepoint)
        return snap if savepoint else _RecordingSnapshot(snap, self, checkpoint_id, new_mark())

    def record(self, checkpoint_id: int, handle: Handle, mark: int) -> None:
        """Checkpoint ``checkpoint_id``'s asynchronous part returned ``handle``."""
        with self._lock:
            self._records[checkpoint_id] = ({ref.path for ref, _ in handle_files(handle)}, mark)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.delegate.notify_checkpoint_complete(checkpoint_id)
        with self._lock:
            record = self._records.pop(checkpoint_id, None)
            for cid in [c for c in self._records if c < checkpoint_id]:
                del self._records[cid]
        if record is None:
            return
        keep, floor = record
        from sluice.state.changelog.backend import ChangelogKeyedStateBackend

        if isinstance(self.delegate, ChangelogKeyedStateBackend):
            materializing = self.delegate.retention_floor()
            floor = floor if materializing is None else min(floor, materializing)
        self.store.retain(keep, floor)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self.delegate.notify_checkpoint_aborted(checkpoint_id)
        with self._lock:
            self._records.pop(checkpoint_id, None)

    def restore(self, handles: Sequence[Handle]) -> None:
        store = self.store
        used, missing, refused = store.used, store.missing, store.refused
        self.delegate.restore(handles)
        used, missing, refused = store.used - used, store.missing - missing, store.refused - refused
        self._restored = {
            "state.local_recovery.files_local": used,
            "state.local_recovery.files_remote": missing + refused,
            "state.local_recovery.files_refused": refused,
        }
        if used or missing or refused:
            log.info(
                "keyed state restored with local recovery: %d file(s) from the local copy, %d from checkpoint "
                "storage (%d local copies refused)", used, missing + refused, refused,
            )  # fmt: skip

    def restore_metrics(self) -> dict[str, int]:
        return {**self.delegate.restore_metrics(), **self._restored}
