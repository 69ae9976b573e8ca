"""The completed checkpoints a running coordinator retains (Flink's ``CompletedCheckpointStore``).

:class:`CompletedCheckpointStore` keeps the retained checkpoints (id, folder; oldest first), the job's
index of them (:mod:`sluice.checkpoint.history`), and discards: a completed checkpoint subsumes the oldest
one once more than ``num_retained`` are kept, and the folders of failed checkpoints go too. Index writes and
discards run in order on one cleanup thread, off the coordinator's lock; one that fails is reported,
never raised.

Files shared between checkpoints (incremental checkpoints reference files an earlier checkpoint uploaded)
are counted by a shared-state registry (:class:`SharedState`): the store registers the shared files of
each completed checkpoint, and once older checkpoints are subsumed it deletes the files no retained
checkpoint references any more, never earlier. Full checkpoints reference none (:class:`NoSharedState`):
a checkpoint's folder holds all its files, so discarding the folder deletes them.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from sluice.checkpoint.history import read_index, sweep_incomplete, write_index
from sluice.checkpoint.storage import CheckpointStorage

__all__ = ["CompletedCheckpointStore", "NoSharedState", "SharedState"]

log = logging.getLogger("sluice.checkpoint")


class SharedState(Protocol):
    """The shared-state registry of incremental checkpoints, as the store uses it (Flink's
    ``SharedStateRegistry``): files that several checkpoints reference, each kept while a retained
    checkpoint references it."""

    def register_checkpoint(self, checkpoint_id: int, refs: Iterable[Any], *, restored: bool = False) -> None:
        """Checkpoint ``checkpoint_id`` completed and references the shared files ``refs`` (``restored``:
        a retained checkpoint recorded again, whose placeholders are not checked)."""

    def validate(self, checkpoint_id: int, refs: Iterable[Any]) -> None:
        """Refuse (CheckpointError, declined) a checkpoint that reuses a file no retained checkpoint holds;
        called before its metadata is written."""

    def unregister_unused(self, lowest_retained: int) -> list[str]:
        """Forget and return the shared files no checkpoint from ``lowest_retained`` on references."""

    def discard_unregistered(self, refs: Iterable[Any]) -> list[str]:
        """Of the files a checkpoint that will not complete uploaded, the ones no completed checkpoint
        registered (to delete)."""


class NoSharedState:
    """Full checkpoints share no files: a checkpoint's folder holds all of them."""

    def register_checkpoint(self, checkpoint_id: int, refs: Iterable[Any], *, restored: bool = False) -> None:
        return None

    def validate(self, checkpoint_id: int, refs: Iterable[Any]) -> None:
        return None

    def unregister_unused(self, lowest_retained: int) -> list[str]:
        return []

    def discard_unregistered(self, refs: Iterable[Any]) -> list[str]:
        return []


class CompletedCheckpointStore:
    """A running coordinator's completed checkpoints: retention, the index, and discards.

    Args:
        storage: The job's checkpoint storage.
        num_retained: Completed checkpoints to keep.
        restored: The checkpoint this attempt restored (id, path), if it is not a savepoint.
        report: Called with what failed and the error when a discard or an index write fails (after the
            storage's retries); such failures are never raised.
        shared: The shared-state registry (default: none, every checkpoint is a full one).
    """

    def __init__(
        self,
        storage: CheckpointStorage,
        num_retained: int,
        restored: tuple[int, str] | None,
        report: Callable[[str, BaseException], None],
        shared: SharedState | None = None,
    ) -> None:
        self.storage = storage
        self.num_retained = num_retained
        self._report = report
        #: retained checkpoints (id, path), oldest first
        self.completed: list[tuple[int, str]] = [restored] if restored is not None else []
        #: shared files of the retained checkpoints
        self.shared: SharedState = shared or NoSharedState()
        self._entries: dict[int, dict[str, Any]] | None = None
        self._cleared = 0
        self._queue: queue.Queue[tuple[str, Callable[[], None]]] = queue.Queue()
        self._busy = 0
        self._idle = threading.Condition()
        self._thread: threading.Thread | None = None
        #: every completed checkpoint's shared files are in the registry: files under ``shared/`` it does
        #: not know are orphans, deleted when the store closes (set once the registry was rebuilt)
        self.orphans_known = False

    def _load(self) -> dict[int, dict[str, Any]]:
        if self._entries is None:
            try:
                index = read_index(self.storage) or {}
            except Exception as exc:  # rewritten from what this store knows
                log.warning("%s; it is rewritten", exc)
                index = {}
            self._cleared = int(index.get("cleared_through", 0))
            self._entries = {int(e["id"]): dict(e) for e in index.get("checkpoints", [])}
            # older checkpoints the job retains from before the restored one: retention deletes them in turn
            if self.completed and self.completed[0][1] == self.storage.checkpoint_dir(self.completed[0][0]):
                first = self.completed[0][0]
                older = sorted(
                    (cid, self.storage.job_dir() + "/" + e["dir"])
                    for cid, e in self._entries.items()
                    if cid < first and e["kind"] == "checkpoint"
                )
                self.completed[:0] = older
        return self._entries

    def retained(self) -> list[tuple[int, str]]:
        """The completed checkpoints retained now (id, path), oldest first, the job's record included."""
        self._load()
        return list(self.completed)

    def add(self, checkpoint_id: int, directory: str, savepoint: bool, shared: Iterable[Any] = ()) -> None:
        """Record a completed checkpoint (its metadata is written) and the shared files it references: the
        index is rewritten, subsumed checkpoints beyond ``num_retained`` are discarded, and so are shared
        files no retained checkpoint references any more."""
        entries = self._load()
        kind = "savepoint" if savepoint else "checkpoint"
        entries[checkpoint_id] = {"id": checkpoint_id, "dir": directory.rsplit("/", 1)[-1], "kind": kind}
        if not savepoint:
            self.shared.register_checkpoint(checkpoint_id, shared)
            self.completed.append((checkpoint_id, directory))
            while len(self.completed) > self.num_retained:
                old, path = self.completed.pop(0)
                if path == self.storage.checkpoint_dir(old):  # never a restored checkpoint kept elsewhere
                    entries.pop(old, None)
                    self.discard(old, False)
            if self.completed:
                self._discard_shared(self.shared.unregister_unused(self.completed[0][0]))
        # off the coordinator's path, in order with the discards (an index that lags only guards less)
        snapshot, cleared = dict(entries), self._cleared
        self._submit(
            f"writing the checkpoint index after checkpoint {checkpoint_id}",
            lambda: write_index(self.storage, snapshot, cleared),
        )

    def discard(self, checkpoint_id: int, savepoint: bool) -> None:
        """Delete a checkpoint's folder in the background (a failure is reported)."""
        self._submit(
            f"discarding checkpoint {checkpoint_id}", lambda: self.storage.discard(checkpoint_id, savepoint)
        )

    def discard_uploads(self, refs: Iterable[Any]) -> None:
        """A checkpoint that will not complete: delete the shared files it uploaded that no completed
        checkpoint registered (its reused ones stay), in the background."""
        self._discard_shared(self.shared.discard_unregistered(refs))

    def _discard_shared(self, files: list[str]) -> None:
        """Delete shared files (paths relative to the job's folder) in the background."""
        for f in files:
            path = f"{self.storage.job_dir()}/{f}"
            delete = functools.partial(self.storage.retrying, "delete", self.storage.delete_file, path)
            self._submit(f"deleting shared file {f}", delete)

    def _sweep_orphans(self) -> None:
        orphans = getattr(self.shared, "orphans", None)
        if orphans is not None:
            listed = [f"shared/{f}" for f in self.storage.list_files(f"{self.storage.job_dir()}/shared")]
            for f in orphans(listed):
                self.storage.retrying("delete", self.storage.delete_file, f"{self.storage.job_dir()}/{f}")

    def discard_orphans(self, files: list[str]) -> None:
        """Delete shared files no checkpoint of the job references (left by checkpoints that never
        completed before a crash), in the background. Only before the attempt's first checkpoint."""
        self._discard_shared(files)

    def sweep_dead_attempts(self, first_id: int) -> None:
        """Delete, in the background, the folders of checkpoints below ``first_id`` (the attempt's first) that
        never completed: a process killed while writing one never swept it (its close did not run)."""
        self._submit("deleting folders of failed checkpoints", lambda: sweep_incomplete(self.storage, first_id))

    def close(self, timeout: float, sweep: bool = True) -> None:
        """Wait up to ``timeout`` seconds for the discards under way; then (``sweep``) delete the folders
        of checkpoints that never completed. What is not done by then goes on in the background."""
        if sweep:
            self._submit("deleting folders of failed checkpoints", lambda: sweep_incomplete(self.storage))
            if self.orphans_known:
                self._submit("deleting orphaned shared files", self._sweep_orphans)
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._busy and (left := deadline - time.monotonic()) > 0:
                self._idle.wait(left)
            if self._busy:
                log.warning("checkpoint cleanup goes on in the background (%d operation(s) left)", self._busy)

    # -- the cleanup thread ----------------------------------------------------------------------------
    def _submit(self, what: str, fn: Callable[[], None]) -> None:
        with self._idle:
            self._busy += 1
            self._queue.put((what, fn))
            if self._thread is None:  # one thread while there is work; it ends when idle
                self._thread = threading.Thread(target=self._work, name="checkpoint-cleanup", daemon=True)
                self._thread.start()

    def _work(self) -> None:
        while True:
            try:
                what, fn = self._queue.get(timeout=1.0)
            except queue.Empty:
                with self._idle:
                    if self._queue.empty():
                        self._thread = None
                        return
                continue
            try:
                fn()
            except Exception as exc:
                self._report(what, exc)
            finally:
                with self._idle:
                    self._busy -= 1
                    self._idle.notify_all()
