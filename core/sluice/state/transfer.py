"""Moving state files to and from checkpoint storage, authenticated by SHA-256.

:class:`FileTransfer` is the small protocol a keyed backend uploads and downloads through (paths relative
to the job's checkpoint folder); the job's checkpoint storage implements it, :class:`LocalFileTransfer`
is a local folder. Every uploaded file's SHA-256 goes into the backend's handle, which lands in the task
state file the job's checkpoint key signs; :func:`download_verified` refuses a file whose bytes differ, so
RocksDB never opens a file that was changed in storage. A transfer with local recovery
(:class:`~sluice.state.local_recovery.LocalRecoveryTransfer`) offers a verified local copy first.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sluice.errors import RestoreError

__all__ = [
    "FileRef",
    "FileTransfer",
    "LocalFileTransfer",
    "download_verified",
    "new_mark",
    "sha256_file",
    "transfer_location",
    "upload_file",
]

_CHUNK = 1 << 20
_MARKS = itertools.count(1)


def new_mark() -> int:
    """A number larger than every earlier one in this process: orders uploads (local recovery's copies)
    against snapshots and changelog materializations."""
    return next(_MARKS)


class FileTransfer(Protocol):
    """Files by path under one root (the job's checkpoint folder)."""

    def upload(self, local_path: str, remote_path: str) -> None:
        """Store the local file at ``remote_path`` (replacing what is there)."""

    def download(self, remote_path: str, local_path: str) -> None:
        """Copy ``remote_path`` to the local file ``local_path``."""

    def delete(self, remote_path: str) -> None:
        """Delete ``remote_path`` (no error if it is gone)."""

    def exists(self, remote_path: str) -> bool:
        """Whether ``remote_path`` exists."""

    def list(self, prefix: str) -> list[str]:
        """Every file path under the folder ``prefix``."""


@dataclass(frozen=True)
class FileRef:
    """An uploaded file: where, its SHA-256 (hex) and size."""

    path: str
    sha256: str
    size: int

    def to_plain(self) -> dict[str, Any]:
        """As plain data for a handle."""
        return {"path": self.path, "sha256": self.sha256, "size": self.size}

    @classmethod
    def from_plain(cls, data: dict[str, Any]) -> FileRef:
        """From :meth:`to_plain`'s data."""
        return cls(str(data["path"]), str(data["sha256"]), int(data["size"]))


def sha256_file(path: str) -> str:
    """The SHA-256 (hex) of a local file."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def upload_file(transfer: FileTransfer, local_path: str, remote_path: str) -> FileRef:
    """Upload a local file and return its reference (hash computed from the local bytes)."""
    ref = FileRef(remote_path, sha256_file(local_path), os.path.getsize(local_path))
    transfer.upload(local_path, remote_path)
    return ref


def transfer_location(transfer: FileTransfer) -> str:
    """What names a transfer's root across restarts (its ``location`` attribute if it has one)."""
    location = getattr(transfer, "location", None)
    return str(location) if location is not None else type(transfer).__qualname__


def download_verified(transfer: FileTransfer, ref: FileRef, local_path: str) -> None:
    """Download ``ref`` to ``local_path`` if its SHA-256 matches the handle's (a transfer with a
    ``local_copy(ref, local_path) -> bool`` method places a verified local copy instead, when it has one).

    Raises:
        RestoreError: the file is missing or its bytes are not the ones the checkpoint recorded.
    """
    local_copy = getattr(transfer, "local_copy", None)
    if local_copy is not None and local_copy(ref, local_path):
        return
    tmp = f"{local_path}.{uuid.uuid4().hex[:8]}.part"
    try:
        try:
            transfer.download(ref.path, tmp)
        except FileNotFoundError:
            raise RestoreError(
                f"state file {ref.path} of the checkpoint is missing from checkpoint storage; restore "
                "another checkpoint"
            ) from None
        actual = sha256_file(tmp)
        if actual != ref.sha256:
            raise RestoreError(
                f"state file {ref.path} does not match its checkpoint's SHA-256 (it was modified or "
                "damaged in checkpoint storage); nothing of it was opened. Restore another checkpoint"
            )
        os.replace(tmp, local_path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class LocalFileTransfer:
    """A :class:`FileTransfer` over a local folder (writes are atomic: a temporary file, then a rename)."""

    def __init__(self, root: str) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    @property
    def location(self) -> str:
        """The folder, as an absolute path."""
        return str(self.root.resolve())

    def _path(self, remote_path: str) -> Path:
        p = (self.root / remote_path).resolve()
        if not p.is_relative_to(self.root.resolve()):
            raise ValueError(f"{remote_path!r} leaves the transfer's root")
        return p

    def upload(self, local_path: str, remote_path: str) -> None:
        target = self._path(remote_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".upload-")
        os.close(fd)
        try:
            shutil.copyfile(local_path, tmp)
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def download(self, remote_path: str, local_path: str) -> None:
        shutil.copyfile(self._path(remote_path), local_path)

    def delete(self, remote_path: str) -> None:
        self._path(remote_path).unlink(missing_ok=True)

    def exists(self, remote_path: str) -> bool:
        return self._path(remote_path).is_file()

    def list(self, prefix: str) -> list[str]:
        base = self._path(prefix)
        if not base.is_dir():
            return []
        root = self.root.resolve()
        return sorted(str(p.relative_to(root)) for p in base.rglob("*") if p.is_file() and not p.name.startswith(".upload-"))
