"""The file sink's storage: where in-progress files are written, how they are staged and published.

A :class:`FileSystem` works with paths relative to the sink's root. Writers write in-progress files to a
local path (:meth:`FileSystem.inprogress_path`); :meth:`~FileSystem.stage` makes one durable under its
hidden pending name (local: fsync + rename; S3: upload) and :meth:`~FileSystem.publish` makes it visible
under its final name, idempotently. ``FileSinkOptions.filesystem`` picks the implementation from the root's
scheme: :class:`LocalFileSystem` here, ``S3FileSystem`` in :mod:`sluice.sinks.files.s3filesystem`.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass

import pyarrow as pa
from sluice.errors import CommitError
from sluice.sinks.files.committable import FileCommittable, committed_checkpoint_of, is_staging_of

__all__ = ["FileSystem", "LocalFileSystem", "Staged", "local_tmp_dir"]


@dataclass(frozen=True)
class Staged:
    """Where stage() put a file: a pending path, or an uncompleted multipart upload of the final key."""

    staged: str
    upload_id: str | None = None
    parts: tuple[tuple[int, str], ...] = ()


class FileSystem(ABC):
    """Storage of one file sink root."""

    root: str

    @abstractmethod
    def inprogress_path(self, rel: str) -> str:
        """A local path to write the in-progress file ``rel`` (hidden) to; parent folders exist."""

    @abstractmethod
    def stage(self, local_path: str, pending: str, final: str) -> Staged:
        """Make the closed file at ``local_path`` durable as ``pending`` (or as an upload of ``final``)."""

    @abstractmethod
    def open_staged(self, c: FileCommittable) -> pa.NativeFile:
        """Read a staged (not multipart) file."""

    @abstractmethod
    def publish(self, c: FileCommittable) -> bool:
        """Make ``c`` visible under ``c.final`` (True), or do nothing if it already is (False). Then delete
        ``c.replaces``."""

    @abstractmethod
    def delete_staged(self, rel: str) -> None:
        """Delete a staged file; a no-op if it is gone."""

    @abstractmethod
    def cleanup(self, job_id: str, keep: set[str]) -> int:
        """Delete staged files and abort uploads of ``job_id`` whose path or upload id is not in ``keep``."""

    @abstractmethod
    def committed_checkpoint(self, job_id: str) -> int:
        """The newest checkpoint of ``job_id`` that a visible file names (0 if none): one listing."""

    @abstractmethod
    def probe(self) -> None:
        """Write and delete a small hidden file under the root (at job start: is the output writable?)."""

    def discard_local(self, local_path: str) -> None:
        """Drop an in-progress file that will never be staged."""
        try:
            os.remove(local_path)
        except FileNotFoundError:
            pass

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release clients and temporary folders."""


class LocalFileSystem(FileSystem):
    """A local (or mounted) folder. In-progress and pending files are hidden siblings of the final file."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root.removeprefix("file://"))

    def _abs(self, rel: str) -> str:
        return os.path.join(self.root, *rel.split("/"))

    def inprogress_path(self, rel: str) -> str:
        path = self._abs(rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return path

    def stage(self, local_path: str, pending: str, final: str) -> Staged:
        dst = self._abs(pending)
        fd = os.open(local_path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(local_path, dst)
        _fsync_dir(os.path.dirname(dst))
        return Staged(pending)

    def open_staged(self, c: FileCommittable) -> pa.NativeFile:
        return pa.memory_map(self._abs(c.staged))

    def publish(self, c: FileCommittable) -> bool:
        src, dst = self._abs(c.staged), self._abs(c.final)
        published = False
        if os.path.exists(dst):
            pass  # already visible: commit is idempotent
        elif os.path.exists(src):
            os.replace(src, dst)
            published = True
        else:
            raise CommitError(
                f"file sink: {c.final} is neither pending ({c.staged}) nor committed under {self.root}:"
                " its data is lost (was the staging file deleted by hand?)"
            )
        for r in c.replaces:
            self.delete_staged(r)
        return published

    def delete_staged(self, rel: str) -> None:
        try:
            os.remove(self._abs(rel))
        except FileNotFoundError:
            pass

    def cleanup(self, job_id: str, keep: set[str]) -> int:
        n = 0
        for dirpath, _, files in os.walk(self.root):
            for f in files:
                if not is_staging_of(f, job_id):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, f), self.root).replace(os.sep, "/")
                if rel not in keep:
                    self.delete_staged(rel)
                    n += 1
        return n


    def probe(self) -> None:
        os.makedirs(self.root, exist_ok=True)
        path = os.path.join(self.root, f".sluice-probe-{uuid.uuid4().hex}")
        with open(path, "wb") as f:
            f.write(b"sluice")
        os.remove(path)

    def committed_checkpoint(self, job_id: str) -> int:
        newest = 0
        for _, _, files in os.walk(self.root):
            for f in files:
                newest = max(newest, committed_checkpoint_of(f, job_id) or 0)
        return newest


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def local_tmp_dir(base: str | None) -> str:
    """A private temporary folder for in-progress files of a remote file system."""
    return tempfile.mkdtemp(prefix="sluice-filesink-", dir=base)

