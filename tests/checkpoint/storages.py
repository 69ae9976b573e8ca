"""Checkpoint storages for tests: local storage with operations that fail on demand (an outage)."""

from __future__ import annotations

import errno
import threading
from typing import Any

from sluice.checkpoint.storage import LocalCheckpointStorage


class FlakyStorage(LocalCheckpointStorage):
    """Local checkpoint storage whose primitives fail with ``EIO`` (transient) while their kind (``write``,
    ``read``, ``list``, ``delete``) is in :attr:`down`; :attr:`fired` records every injected failure."""

    def __init__(self, base: str, job_id: str) -> None:
        super().__init__(base, job_id)
        self.down: set[str] = set()
        self.fired: list[str] = []
        self._lock = threading.Lock()

    def _outage(self, kind: str, path: str) -> None:
        with self._lock:
            if kind in self.down:
                self.fired.append(f"{kind} {path}")
                raise OSError(errno.EIO, f"injected storage outage ({kind})", path)

    def write_file(self, path: str, data: bytes) -> None:
        self._outage("write", path)
        super().write_file(path, data)

    def write_atomic(self, path: str, data: bytes) -> None:
        self._outage("write", path)
        super().write_atomic(path, data)

    def read_file(self, path: str) -> bytes:
        self._outage("read", path)
        return super().read_file(path)

    def list_dirs(self, path: str) -> list[str]:
        self._outage("list", path)
        return super().list_dirs(path)

    def delete_dir(self, path: str) -> None:
        self._outage("delete", path)
        super().delete_dir(path)


def use_storage(monkeypatch: Any, storage: LocalCheckpointStorage) -> None:
    """Make jobs run with ``storage`` (its retry time from their CheckpointConfig)."""
    import sluice.runtime.job as job_module

    def storage_for(config: Any, job_id: str) -> LocalCheckpointStorage:
        assert job_id == storage.job_id, job_id
        storage.retry_timeout = config.storage_retry_timeout
        return storage

    monkeypatch.setattr(job_module, "storage_for", storage_for)
