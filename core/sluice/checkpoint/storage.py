"""Where checkpoints live: ``<base>/<job-id>/chk-<n>/...`` plus a ``_metadata`` file written last.

The presence of ``_metadata`` alone marks a checkpoint complete; a directory without it is never restored
from. Savepoints live in ``<base>/<job-id>/savepoint-<n>/`` and are never deleted by retention.
Implementations: :class:`LocalCheckpointStorage` here and :class:`~sluice.checkpoint.s3.S3CheckpointStorage`;
:mod:`sluice.checkpoint.storage_loader` picks the one a URI names.

Every checkpoint operation (writing a task's state or the metadata, reading, listing, discarding) is retried
with backoff (tenacity) while it fails with an error its storage calls transient (:meth:`transient`: for a
file system an I/O error, a timeout, a stale handle; for S3 a connection failure, throttling, a 5xx), for
at most :attr:`CheckpointStorage.retry_timeout` seconds (``CheckpointConfig.storage_retry_timeout``,
default 30); the attempt under way when that time is up still finishes. Other errors (a missing file, no
permission, a full disk) are raised at once.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import json
import logging
import os
import shutil
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import tenacity

from sluice.checkpoint.paths import CHECKPOINT_DIR as _DIR
from sluice.checkpoint.paths import parse_checkpoint_uri, same_folder
from sluice.errors import RestoreError, StorageError

__all__ = [
    "CheckpointStorage",
    "LocalCheckpointStorage",
    "parse_checkpoint_uri",
    "same_folder",
]

log = logging.getLogger("sluice.checkpoint")

T = TypeVar("T")

METADATA = "_metadata"
#: file system errors a retry may cure: I/O errors, timeouts, stale or busy handles, a lost network mount
_TRANSIENT_ERRNOS = {
    getattr(errno, name)
    for name in ("EIO", "EAGAIN", "EBUSY", "EINTR", "ETIMEDOUT", "ESTALE", "ECONNRESET", "ECONNABORTED",
                 "ECONNREFUSED", "ENETDOWN", "ENETUNREACH", "EHOSTDOWN", "EHOSTUNREACH")
}  # fmt: skip


class CheckpointStorage(ABC):
    """Reads and writes checkpoint files of one job under ``base``."""

    #: seconds a checkpoint operation is retried while it fails transiently (0: tried once)
    retry_timeout: float = 30.0

    def __init__(self, base: str, job_id: str) -> None:
        self.base = base.rstrip("/")
        self.job_id = job_id

    # -- retries -------------------------------------------------------------------------------------
    def transient(self, error: BaseException) -> bool:
        """Whether ``error`` (raised by a primitive) may go away if the operation is tried again."""
        return False

    def retrying(self, operation: str, fn: Callable[..., T], /, *args: Any) -> T:
        """``fn(*args)``, retried with exponential backoff (0.1 s doubling to 2 s) while it fails with a
        :meth:`transient` error, for at most :attr:`retry_timeout` seconds; then its last error is raised."""

        def note(state: tenacity.RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome is not None else None
            log.log(
                logging.WARNING if state.attempt_number == 1 else logging.DEBUG,
                "checkpoint storage %s: %s failed (%s: %s); retrying for up to %gs in all",
                self.base, operation, type(exc).__name__, exc, self.retry_timeout,
            )  # fmt: skip

        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_delay(self.retry_timeout),
            wait=tenacity.wait_exponential(multiplier=0.1, max=2.0),
            retry=tenacity.retry_if_exception(self.transient),
            before_sleep=note,
            reraise=True,
        )
        return retrying(fn, *args)

    # -- paths ---------------------------------------------------------------------------------------
    def job_dir(self) -> str:
        return f"{self.base}/{self.job_id}"

    def checkpoint_dir(self, checkpoint_id: int, savepoint: bool = False) -> str:
        return f"{self.job_dir()}/{'savepoint' if savepoint else 'chk'}-{checkpoint_id}"

    # -- primitives ----------------------------------------------------------------------------------
    @abstractmethod
    def write_file(self, path: str, data: bytes) -> None: ...

    @abstractmethod
    def read_file(self, path: str) -> bytes: ...

    @abstractmethod
    def exists(self, path: str) -> bool: ...

    @abstractmethod
    def list_dirs(self, path: str) -> list[str]:
        """Names of the entries directly under ``path``."""

    @abstractmethod
    def delete_dir(self, path: str) -> None: ...

    @abstractmethod
    def write_atomic(self, path: str, data: bytes) -> None:
        """Write ``data`` so that readers see all of it or nothing (rename, conditional put)."""

    def replace(self, path: str, data: bytes) -> None:
        """Write ``data`` over whatever ``path`` holds, so that readers see the old or the new bytes, never a
        mix (an object store's put does that; a file system writes a temporary file and renames it)."""
        self.write_file(path, data)

    def delete_file(self, path: str) -> None:
        """Delete one file (nothing if it does not exist). Storages that cannot raise NotImplementedError."""
        raise NotImplementedError(f"{type(self).__name__} cannot delete single files")

    def upload_file(self, local_path: str, path: str) -> None:
        """Store the local file at ``path`` (a state backend's file; storages stream it where they can)."""
        with open(local_path, "rb") as f:
            self.write_file(path, f.read())

    def download_file(self, path: str, local_path: str) -> None:
        """Copy ``path`` into the local file ``local_path`` (FileNotFoundError if it is missing)."""
        data = self.read_file(path)
        with open(local_path, "wb") as f:
            f.write(data)

    def list_files(self, path: str) -> list[str]:
        """Every file under the folder ``path``, recursively, as paths relative to it."""
        raise NotImplementedError(f"{type(self).__name__} cannot list files")

    # -- checkpoint operations -----------------------------------------------------------------------
    def write_task_state(self, checkpoint_id: int, name: str, data: bytes, savepoint: bool = False) -> str:
        path = f"{self.checkpoint_dir(checkpoint_id, savepoint)}/{name}"
        self.retrying("write task state", self.write_file, path, data)
        return path

    def write_metadata(self, checkpoint_id: int, metadata: dict[str, Any], savepoint: bool = False) -> str:
        path = f"{self.checkpoint_dir(checkpoint_id, savepoint)}/{METADATA}"
        data = json.dumps(metadata, indent=1, sort_keys=True).encode()
        self.retrying("write metadata", self.write_atomic, path, data)
        return path

    def read_metadata_at(self, checkpoint_path: str) -> dict[str, Any]:
        """The metadata of the checkpoint at ``checkpoint_path``.

        Raises:
            RestoreError: it has no metadata file, or the file is not checkpoint metadata (names the file).
        """
        path = f"{checkpoint_path.rstrip('/')}/{METADATA}"
        try:
            raw = self.retrying("read metadata", self.read_file, path)
        except FileNotFoundError:
            raise RestoreError(
                f"{checkpoint_path} is not a completed checkpoint: it has no {METADATA} file"
            ) from None
        except (IsADirectoryError, NotADirectoryError) as exc:
            raise RestoreError(f"{checkpoint_path} is not a checkpoint directory ({exc})") from None
        except StorageError as exc:
            if exc.operation != "resolve":
                raise
            raise RestoreError(f"{checkpoint_path} cannot be restored: {exc}") from None
        try:
            meta = json.loads(raw)
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
            raise RestoreError(
                f"{path} is corrupt ({type(exc).__name__}: {exc})"
            ) from None
        if not isinstance(meta, dict) or not isinstance(meta.get("tasks"), dict) or "checkpoint_id" not in meta:
            raise RestoreError(f"{path} is corrupt (not checkpoint metadata)")
        return meta

    def completed(self) -> list[tuple[int, str, bool]]:
        """Completed checkpoints and savepoints of the job: (id, path, is_savepoint), oldest first."""
        return self.retrying("list checkpoints", self._folders, True)

    def incomplete(self) -> list[tuple[int, str, bool]]:
        """Checkpoint and savepoint folders without metadata (being written, or left by a failed one)."""
        return self.retrying("list checkpoints", self._folders, False)

    def _folders(self, complete: bool) -> list[tuple[int, str, bool]]:
        out = []
        for name in self.list_dirs(self.job_dir()):
            m = _DIR.match(name)
            if m and self.exists(f"{self.job_dir()}/{name}/{METADATA}") == complete:
                out.append((int(m.group(2)), f"{self.job_dir()}/{name}", m.group(1) == "savepoint"))
        return sorted(out)

    def latest(self) -> str | None:
        """Path of the latest completed checkpoint (not savepoint), or None."""
        chks = [p for _, p, sp in self.completed() if not sp]
        return chks[-1] if chks else None

    def discard(self, checkpoint_id: int, savepoint: bool = False) -> None:
        self.retrying("discard", self.delete_dir, self.checkpoint_dir(checkpoint_id, savepoint))

    def read_stats(self) -> list[dict[str, Any]]:
        """The job's checkpoint statistics kept on storage, oldest first
        (:class:`~sluice.checkpoint.stats_log.CheckpointStatsLog`)."""
        from sluice.checkpoint.stats_log import CheckpointStatsLog  # it builds on this module

        return CheckpointStatsLog(self).read()

    def check_writable(self) -> None:
        """Write and delete a small file in the job's folder (a probe at job start).

        Raises:
            StorageError: not recoverable, naming the location, if the storage refuses (after the retries
                of transient errors).
        """
        probe = f"{self.job_dir()}/_probe-{uuid.uuid4().hex}"
        try:
            self.retrying("probe", self.write_file, f"{probe}/probe", b"sluice")
            self.retrying("probe", self.delete_dir, probe)
        except Exception as exc:
            with contextlib.suppress(Exception):  # the probe's folder, if it was made (a full disk)
                self.delete_dir(probe)
            text = " ".join(f"{type(exc).__name__}: {exc}".split())
            error = StorageError(
                f"checkpoint storage {self.base} is not writable: {text} (CheckpointConfig.storage, "
                "state.checkpoints.dir: fix the location or its permissions)",
                operation="probe",
                bucket=self.base,
                code=str(getattr(exc, "code", "")),
            )
            error.recoverable = False
            raise error from exc

    def holds_job(self) -> bool:
        """Whether the job's folder holds checkpoint data: a stats history, an index or a checkpoint folder."""
        names = self.retrying("list", self.list_dirs, self.job_dir())
        return any(_DIR.match(name) or name in ("_stats", "_stats.jsonl", "_checkpoints") for name in names)

    def jobs(self) -> list[str]:
        """Job ids with checkpoint data under ``base`` (other folders there are not counted)."""
        names = self.retrying("list jobs", self.list_dirs, self.base)
        return sorted(j for j in names if self._for_job(j).holds_job())

    def _for_job(self, job_id: str) -> CheckpointStorage:
        """The same storage for another job (shares clients where the implementation has them)."""
        clone = copy.copy(self)
        clone.job_id = job_id
        return clone


class LocalCheckpointStorage(CheckpointStorage):
    """Checkpoints on a local (or mounted) filesystem. Metadata: write to a temp file, fsync, rename."""

    def __init__(self, base: str, job_id: str) -> None:
        super().__init__(str(Path(base.removeprefix("file://")).absolute()), job_id)

    def transient(self, error: BaseException) -> bool:
        return isinstance(error, OSError) and error.errno in _TRANSIENT_ERRNOS

    def write_file(self, path: str, data: bytes) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            with open(path, "wb") as f:
                f.write(data)
        except BaseException:
            _remove(path)  # no half-written file is left behind (a full disk leaves none)
            raise

    def read_file(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def list_dirs(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except FileNotFoundError:
            return []

    def delete_dir(self, path: str) -> None:
        for attempt in range(3):
            try:
                _rmtree(path)
                return
            except OSError as exc:
                # a writer that lost the race with an abort may add a file while the tree is removed
                if exc.errno != errno.ENOTEMPTY or attempt == 2:
                    raise

    def delete_file(self, path: str) -> None:
        _remove(path)

    def upload_file(self, local_path: str, path: str) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        try:
            shutil.copyfile(local_path, tmp)
            os.replace(tmp, path)
        except BaseException:
            _remove(tmp)
            raise

    def download_file(self, path: str, local_path: str) -> None:
        shutil.copyfile(path, local_path)

    def list_files(self, path: str) -> list[str]:
        out: list[str] = []
        for folder, _, files in os.walk(path):
            out.extend(os.path.relpath(os.path.join(folder, f), path) for f in files if not f.endswith(".tmp"))
        return sorted(out)

    def replace(self, path: str, data: bytes) -> None:
        self.write_atomic(path, data)

    def write_atomic(self, path: str, data: bytes) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            _remove(tmp)  # a failed write (a full disk) leaves no temporary file
            raise


def _rmtree(path: str) -> None:
    """Remove a tree; what is gone already is fine, any other error is raised (not ignored)."""
    try:
        entries = list(os.scandir(path))
    except FileNotFoundError:
        return
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            _rmtree(entry.path)
        else:
            try:
                os.remove(entry.path)
            except FileNotFoundError:
                pass
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("could not remove %s: %s", path, exc)
