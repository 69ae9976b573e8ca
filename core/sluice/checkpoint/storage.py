"""Where checkpoints live: ``<base>/<job-id>/chk-<n>/...`` plus a ``_metadata`` file written last.

The presence of ``_metadata`` alone marks a checkpoint complete; a directory without it is never restored
from. Savepoints live in ``<base>/<job-id>/savepoint-<n>/`` and are never deleted by retention.
Implementations: :class:`LocalCheckpointStorage` here and :class:`~sluice.checkpoint.s3.S3CheckpointStorage`
(``s3://``, imported only when used, so boto3 loads only for S3); other schemes come from the
``sluice.checkpoint_storage`` entry point group.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import uuid
from abc import ABC, abstractmethod
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from sluice.errors import ConfigError, RestoreError

__all__ = ["CheckpointStorage", "LocalCheckpointStorage", "checkpoint_storage", "parse_checkpoint_uri"]

METADATA = "_metadata"
_DIR = re.compile(r"^(chk|savepoint)-(\d+)$")


class CheckpointStorage(ABC):
    """Reads and writes checkpoint files of one job under ``base``."""

    def __init__(self, base: str, job_id: str) -> None:
        self.base = base.rstrip("/")
        self.job_id = job_id

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

    @abstractmethod
    def append_line(self, path: str, line: str) -> None: ...

    # -- checkpoint operations -----------------------------------------------------------------------
    def write_task_state(self, checkpoint_id: int, name: str, data: bytes, savepoint: bool = False) -> str:
        path = f"{self.checkpoint_dir(checkpoint_id, savepoint)}/{name}"
        self.write_file(path, data)
        return path

    def write_metadata(self, checkpoint_id: int, metadata: dict[str, Any], savepoint: bool = False) -> str:
        path = f"{self.checkpoint_dir(checkpoint_id, savepoint)}/{METADATA}"
        self.write_atomic(path, json.dumps(metadata, indent=1, sort_keys=True).encode())
        return path

    def read_metadata_at(self, checkpoint_path: str) -> dict[str, Any]:
        path = f"{checkpoint_path.rstrip('/')}/{METADATA}"
        if not self.exists(path):
            raise RestoreError(f"{checkpoint_path} is not a completed checkpoint: it has no {METADATA} file")
        return json.loads(self.read_file(path))  # type: ignore[no-any-return]

    def completed(self) -> list[tuple[int, str, bool]]:
        """Completed checkpoints and savepoints of the job: (id, path, is_savepoint), oldest first."""
        out = []
        for name in self.list_dirs(self.job_dir()):
            m = _DIR.match(name)
            if m and self.exists(f"{self.job_dir()}/{name}/{METADATA}"):
                out.append((int(m.group(2)), f"{self.job_dir()}/{name}", m.group(1) == "savepoint"))
        return sorted(out)

    def latest(self) -> str | None:
        """Path of the latest completed checkpoint (not savepoint), or None."""
        chks = [p for _, p, sp in self.completed() if not sp]
        return chks[-1] if chks else None

    def discard(self, checkpoint_id: int, savepoint: bool = False) -> None:
        self.delete_dir(self.checkpoint_dir(checkpoint_id, savepoint))

    def record_stats(self, stats: dict[str, Any]) -> None:
        self.append_line(f"{self.job_dir()}/_stats.jsonl", json.dumps(stats, sort_keys=True))

    def read_stats(self) -> list[dict[str, Any]]:
        path = f"{self.job_dir()}/_stats.jsonl"
        if not self.exists(path):
            return []
        return [json.loads(x) for x in self.read_file(path).decode().splitlines() if x.strip()]

    def holds_job(self) -> bool:
        """Whether the job's folder holds checkpoint data: a stats history or a checkpoint folder."""
        if self.exists(f"{self.job_dir()}/_stats.jsonl"):
            return True
        return any(_DIR.match(name) for name in self.list_dirs(self.job_dir()))

    def jobs(self) -> list[str]:
        """Job ids with checkpoint data under ``base`` (other folders there are not counted)."""
        return sorted(j for j in self.list_dirs(self.base) if self._for_job(j).holds_job())

    def _for_job(self, job_id: str) -> CheckpointStorage:
        """The same storage for another job (shares clients where the implementation has them)."""
        clone = copy.copy(self)
        clone.job_id = job_id
        return clone


class LocalCheckpointStorage(CheckpointStorage):
    """Checkpoints on a local (or mounted) filesystem. Metadata: write to a temp file, fsync, rename."""

    def __init__(self, base: str, job_id: str) -> None:
        super().__init__(str(Path(base.removeprefix("file://")).absolute()), job_id)

    def write_file(self, path: str, data: bytes) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)

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
        shutil.rmtree(path, ignore_errors=True)

    def write_atomic(self, path: str, data: bytes) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def append_line(self, path: str, line: str) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def checkpoint_storage(uri: str, job_id: str, **options: Any) -> CheckpointStorage:
    """The storage for ``uri``: a local path, ``file://...``, or a scheme registered under the
    ``sluice.checkpoint_storage`` entry point group (``s3://``)."""
    if "://" not in uri or uri.startswith("file://"):
        return LocalCheckpointStorage(uri, job_id)
    scheme = uri.split("://", 1)[0]
    if scheme == "s3":
        from sluice.checkpoint.s3 import S3CheckpointStorage

        return S3CheckpointStorage(uri, job_id, **options)
    for ep in entry_points(group="sluice.checkpoint_storage"):
        if ep.name == scheme:
            cls = ep.load()
            return cls(uri, job_id, **options)  # type: ignore[no-any-return]
    raise ConfigError(
        f"checkpoint storage: no storage for scheme {scheme!r} (allowed: local path, file://, s3://)"
    )


def parse_checkpoint_uri(uri: str) -> tuple[str, str, str]:
    """Split ``<base>/<job-id>/chk-<n>`` into (base, job id, checkpoint dir name)."""
    trimmed = uri.rstrip("/")
    parts = trimmed.rsplit("/", 2)
    if len(parts) != 3 or not _DIR.match(parts[2]):
        raise RestoreError(
            f"{uri!r} is not a checkpoint path (expected <base>/<job-id>/chk-<n> or savepoint-<n>)"
        )
    return parts[0], parts[1], parts[2]
