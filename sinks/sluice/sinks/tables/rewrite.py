"""The optional background rewrite: a table commit of its own that merges a partition's older small files.

Per checkpoint the compactor stage already leaves one file per partition; over hours those add up. A
:class:`RewritePolicy` on a table sink starts a :class:`BackgroundRewriter` thread next to the global
committer (on the driver): after every ``every`` checkpoint commits it looks for partitions with at least
``min_files`` files under ``target_size`` and replaces them in one atomic commit (Delta: ``optimize``
compaction; Iceberg: an overwrite snapshot that deletes the small files and adds the merged one). Readers
see either the small files or the merged one, never both, never neither.

It never interferes with the exactly-once commits: it only removes files a commit already published, adds
no rows, and records nothing the idempotence check reads (Delta app transactions, Iceberg's
``sluice.max-committed-checkpoint-id`` summary property). It never fails a checkpoint. A rewrite that loses
a race against the sink's own commits (in upsert mode every checkpoint's merge replaces the small files that
hold changed keys, so a rewrite planned before it finds some of its files gone) takes its turn at once
(:func:`take_turn`): it plans, merges and commits that partition again holding the lock the checkpoint commits
take, which then wait for it. So compaction makes progress however often the job commits; the price is that a
checkpoint commit may wait for one partition's rewrite. A rewrite that loses against another writer even so
is counted (``rewrite_failures``) and tried again at the next round.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from sluice.errors import ConfigError
from sluice.sinks.tables.errors import RewriteLostRace

__all__ = ["BackgroundRewriter", "RewritePolicy", "rewrite_policy", "take_turn"]

log = logging.getLogger("sluice.sinks.tables")


@dataclass(frozen=True)
class RewritePolicy:
    """When the background rewrite runs and what it merges.

    Attributes:
        every: look for small files after every this many checkpoint commits.
        min_files: rewrite a partition once it holds at least this many files smaller than ``target_size``.
        target_size: bytes; files smaller than this are merged into files of about this size.
    """

    every: int = 10
    min_files: int = 10
    target_size: int = 128 * 1024 * 1024

    def validate(self, sink: str) -> None:
        """Raise ConfigError naming the option and the allowed values."""
        for opt, low in (("every", 1), ("min_files", 2), ("target_size", 1)):
            v = getattr(self, opt)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ConfigError(f"{sink}: rewrite.{opt} must be an integer >= {low} (got {v!r})")


def rewrite_policy(value: object, sink: str) -> RewritePolicy | None:
    """A sink's ``rewrite`` option as a validated policy: a RewritePolicy, a dict of its options, True
    (defaults), or None / False (off)."""
    if value is None or value is False:
        return None
    if value is True:
        value = RewritePolicy()
    if isinstance(value, dict):
        try:
            value = RewritePolicy(**value)
        except TypeError as exc:
            raise ConfigError(f"{sink}: rewrite: {exc}") from None
    if not isinstance(value, RewritePolicy):
        raise ConfigError(
            f"{sink}: rewrite must be a RewritePolicy, a dict of its options, True or None (got {value!r})"
        )
    value.validate(sink)
    return value


def take_turn(lock: threading.Lock | None, attempt: Callable[[bool], int]) -> int:
    """Run one partition's rewrite: ``attempt(False)`` first, which merges without ``lock`` (taking it for its
    commit step at most); if that raises :class:`~sluice.sinks.tables.errors.RewriteLostRace`,
    ``attempt(True)`` with ``lock`` held from planning to commit, so the commits that share the lock cannot
    win the race again. Returns what the attempt returns (files replaced).

    Without a lock there is no turn to take: the lost race is raised (the next round tries again).
    """
    try:
        return attempt(False)
    except RewriteLostRace as exc:
        if lock is None:
            raise
        log.info("%s; rewriting the partition again holding the commit lock", exc)
    with lock:
        return attempt(True)


class BackgroundRewriter:
    """Runs ``rewrite()`` on its own thread after every ``policy.every`` calls of :meth:`committed`.

    ``rewrite`` returns how many files it replaced; failures are logged and counted (metric
    ``rewrite_failures``), and the next round tries again.
    """

    def __init__(
        self, name: str, policy: RewritePolicy, rewrite: Callable[[], int], metric: Callable[[str, int], None]
    ) -> None:
        self.name = name
        self.policy = policy
        self._rewrite = rewrite
        self._metric = metric
        self._commits = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.rounds = 0
        self._thread = threading.Thread(target=self._loop, name=f"rewrite-{name}", daemon=True)
        self._thread.start()

    def committed(self) -> None:
        """A checkpoint commit landed."""
        self._commits += 1
        if self._commits % self.policy.every == 0:
            self._wake.set()

    def run_now(self) -> None:
        """Ask for a round at once."""
        self._wake.set()

    def close(self, timeout: float = 30.0) -> None:
        """Stop after the round in progress (its commit lands whole or not at all)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                replaced = self._rewrite()
            except Exception as exc:
                self._metric("rewrite_failures", 1)
                log.warning(
                    "%s: background rewrite failed (tried again at the next round): %s", self.name, exc
                )
            else:
                self.rounds += 1
                if replaced:
                    self._metric("rewrite_commits", 1)
                    self._metric("rewrite_files_replaced", replaced)
