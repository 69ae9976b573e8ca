"""Keyed state backends' files in checkpoint storage: the transfer they upload through, and what the
checkpoint protocol reads from their handles.

:class:`CheckpointFileTransfer` is the :class:`~sluice.state.transfer.FileTransfer` of a job's checkpoint
storage (local or S3), rooted at the job's folder: files several checkpoints share go to
``<job-dir>/shared/<owner>/...`` (owned by the coordinator's shared-state registry), a checkpoint's own files
into its folder (``chk-<n>/<owner>/...``, ``savepoint-<n>/<owner>/...``: deleted with it). A subtask's
acknowledgement lists the shared files its keyed state references (:func:`ack_shared`), so the coordinator
counts and deletes them without reading task state files.

A checkpoint restored from another folder (another job's, or a savepoint copied elsewhere) is read through
absolute paths (:func:`localize`); its files are never reused by this job's incremental checkpoints, so this
job never references, counts or deletes them.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from typing import Any

from sluice.checkpoint.storage import CheckpointStorage
from sluice.state.handles import persisted_bytes, total_bytes
from sluice.state.shared_registry import SharedRef, shared_refs

__all__ = [
    "CheckpointFileTransfer",
    "FinishedKeyedState",
    "ack_shared", "is_absolute", "keyed_is_empty", "keyed_sizes", "localize", "refs_of"]


def is_absolute(path: str) -> bool:
    """Whether a handle's path names a location itself (not relative to the job's folder)."""
    return path.startswith("/") or "://" in path


class CheckpointFileTransfer:
    """A :class:`~sluice.state.transfer.FileTransfer` over checkpoint storage, rooted at ``root`` (default the
    job's folder); absolute paths (a restored foreign checkpoint's files) are used as they are. Every
    operation is retried as the storage retries checkpoint writes."""

    def __init__(self, storage: CheckpointStorage, root: str | None = None) -> None:
        self.storage = storage
        self.root = (root or storage.job_dir()).rstrip("/")

    @property
    def location(self) -> str:
        """The root: names this transfer across restarts (local recovery keys its copies by it)."""
        return self.root

    def _abs(self, path: str) -> str:
        if is_absolute(path):
            return path
        parts = path.split("/")
        if not path or ".." in parts or "" in parts:
            raise ValueError(f"{path!r} is not a path inside the job's checkpoint folder")
        return f"{self.root}/{path}"

    def upload(self, local_path: str, remote_path: str) -> None:
        s = self.storage
        s.retrying("upload state file", s.upload_file, local_path, self._abs(remote_path))

    def download(self, remote_path: str, local_path: str) -> None:
        s = self.storage
        s.retrying("download state file", s.download_file, self._abs(remote_path), local_path)

    def delete(self, remote_path: str) -> None:
        s = self.storage
        s.retrying("delete state file", s.delete_file, self._abs(remote_path))

    def exists(self, remote_path: str) -> bool:
        s = self.storage
        return s.retrying("look up state file", s.exists, self._abs(remote_path))

    def list(self, prefix: str) -> list[str]:
        s = self.storage
        base = prefix.rstrip("/")
        return [f"{base}/{p}" for p in s.retrying("list state files", s.list_files, self._abs(base))]


def ack_shared(keyed_handles: Iterable[Any]) -> list[list[Any]]:
    """What an acknowledgement says of the shared files its keyed state handles reference:
    ``[[path, placeholder], ...]`` (plain data, paths relative to the job's folder)."""
    return [[r.path, r.placeholder] for r in shared_refs(h for h in keyed_handles if h)]


def keyed_sizes(keyed_handles: Iterable[Any]) -> dict[str, int]:
    """What a subtask's checkpoint statistics say of its keyed state: ``keyed_bytes``, everything its
    handles reference (what a restore reads), and ``keyed_persisted_bytes``, what this checkpoint wrote (the
    files it uploaded, not the ones it reuses from earlier checkpoints, and state inline in the task file)."""
    handles = [h for h in keyed_handles if h]
    return {
        "keyed_bytes": sum(total_bytes(h) for h in handles),
        "keyed_persisted_bytes": sum(persisted_bytes(h) for h in handles),
    }


def refs_of(handles: Iterable[dict[str, Any]]) -> list[SharedRef]:
    """The shared files a checkpoint's acknowledgements (or its metadata's task entries) reference."""
    out = []
    for h in handles:
        for entry in h.get("shared") or []:
            path, placeholder = entry
            if not is_absolute(str(path)):
                out.append(SharedRef(str(path), bool(placeholder)))
    return out


def keyed_is_empty(handle: Any) -> bool:
    """Whether a keyed state handle holds nothing (no state written by the operator)."""
    if not handle:
        return True
    if isinstance(handle, dict) and handle.get("format") == "canonical":
        return not handle.get("groups") and not handle.get("files")
    return False


def localize(handle: dict[str, Any], checkpoint: str, folder: str) -> dict[str, Any]:
    """A keyed state handle of a checkpoint restored from outside the job's folder, with absolute paths.

    Args:
        handle: the handle, as the checkpoint's task state file holds it.
        checkpoint: where the checkpoint's folder is now.
        folder: the folder's name when it was written (``chk-<n>`` or ``savepoint-<n>``): its own files are
            read from ``checkpoint`` (wherever it was copied), shared ones from beside it.

    Incremental RocksDB handles are marked full, so the restored backend reuses none of their files (this
    job's checkpoints upload their own and never count or delete the foreign ones).
    """
    parent = checkpoint.rstrip("/").rsplit("/", 1)[0]

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            out = {k: walk(v) for k, v in value.items()}
            path = out.get("path")
            if "sha256" in out and isinstance(path, str) and not is_absolute(path):
                head, _, rest = path.partition("/")
                out["path"] = f"{checkpoint.rstrip('/')}/{rest}" if head == folder else posixpath.join(parent, path)
            if out.get("format") == "native":
                out["incremental"] = False
            return out
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    return walk(handle)  # type: ignore[no-any-return]


class FinishedKeyedState:
    """Keeps a finished subtask's keyed state restorable from every later checkpoint.

    A finished subtask acknowledges later checkpoints with its final state file; its keyed state handle may
    name files inside the folder of the checkpoint it was written for (a RocksDB checkpoint's MANIFEST,
    CURRENT and OPTIONS), which retention deletes. Passed to
    :meth:`~sluice.checkpoint.codec.MetadataCodec.without_channel_state`, it copies those files once to
    ``shared/`` and points the handle there. Later checkpoints reference the files the final state reused
    as placeholders (registered by the checkpoint it came from) and the copies as new files, registered by
    the first later checkpoint that completes; an aborted checkpoint never deletes a finished subtask's
    files, and copies no checkpoint came to reference are orphans, deleted when the job ends or restores.

    Args:
        storage: the job's checkpoint storage.
        state_path: the finished subtask's state file (``<job-dir>/chk-<n>/<task>.state``).
        shared: the ``shared`` entries of its acknowledgement.
    """

    def __init__(self, storage: CheckpointStorage, state_path: str, shared: Iterable[Any]) -> None:
        self.storage = storage
        self.folder = state_path.rstrip("/").rsplit("/", 2)[-2]
        self.refs = [SharedRef(r.path, True) for r in refs_of([{"shared": list(shared)}])]
        self.copied: list[SharedRef] = []

    def _copy(self, path: str) -> str:
        _, owner, rest = path.split("/", 2)
        new = f"shared/{owner}/final-{self.folder}-{rest.replace('/', '-')}"
        s, base = self.storage, self.storage.job_dir()
        data = s.retrying("read state file", s.read_file, f"{base}/{path}")
        s.retrying("write state file", s.write_file, f"{base}/{new}", data)
        self.copied.append(SharedRef(new))
        return new

    def __call__(self, handle: Any) -> Any:
        def walk(value: Any) -> Any:
            if isinstance(value, dict):
                out = {k: walk(v) for k, v in value.items()}
                path = out.get("path")
                if "sha256" in out and isinstance(path, str) and path.startswith(self.folder + "/"):
                    out["path"] = self._copy(path)
                return out
            if isinstance(value, list):
                return [walk(v) for v in value]
            return value

        return walk(handle)

    def ack_shared(self) -> list[list[Any]]:
        """The ``shared`` entries of the final acknowledgement."""
        return [[r.path, True] for r in self.refs] + [[r.path, False] for r in self.copied]
