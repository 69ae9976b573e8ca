"""Global commits off the coordinator's path: one ordered committer thread on the driver.

A sink with ``global_commit`` (a table) publishes each completed checkpoint in one commit on the driver.
Committing inside the coordinator's completion held its lock for as long as a table commit takes (hundreds
of milliseconds, seconds under load, more with retries): acknowledgements, expiries and the next trigger
waited. Here completion only hands the checkpoint's committables to a queue; a thread commits them.

Invariants:

* commits run strictly in checkpoint order, one checkpoint at a time, each sink's in a fixed order;
* a checkpoint's committables stay *uncommitted* until its commit returned: every checkpoint completed
  meanwhile records them in its metadata (:meth:`GlobalCommitQueue.uncommitted`), grouped by the
  checkpoint they belong to, so a restore of any later checkpoint commits them again, in order (the
  committer skips what its table already has: commits are idempotent by checkpoint id);
* a commit that keeps failing (after ``commit_with_retry``'s retries) fails the attempt (``on_fatal``) and
  the queue commits nothing after it;
* the attempt ends only after the queue drained (:meth:`drain`: a finished job has committed everything)
  or stopped (:meth:`close`: a failed or cancelled attempt; the next attempt's restore commits the rest),
  so two attempts never commit at the same time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["CommitGroups", "GlobalCommitQueue"]

log = logging.getLogger("sluice.checkpoint")

#: committables of one sink, by the checkpoint they belong to, oldest first: ``[(checkpoint_id, [c, ...])]``
CommitGroups = list[tuple[int, list[Any]]]


class GlobalCommitQueue:
    """Commits completed checkpoints' committables in order, on a thread of its own.

    Args:
        committers: per sink uid, ``commit(checkpoint_id, committables)`` (retrying; raises when it gives up).
        on_fatal: called with the error of a commit that failed for good.
        observe: called with ``(sink_uid, seconds)`` after each commit (commit latency metrics).
    """

    def __init__(
        self,
        committers: dict[str, Callable[[int, list[Any]], object]],
        on_fatal: Callable[[BaseException], None],
        observe: Callable[[str, float], None] | None = None,
    ) -> None:
        self.committers = committers
        self.on_fatal = on_fatal
        self.observe = observe or (lambda uid, seconds: None)
        self._queue: deque[tuple[int, dict[str, list[Any]]]] = deque()
        self._lock = threading.Condition()
        self._busy = False
        self._closed = False
        self._failed: BaseException | None = None
        self._thread: threading.Thread | None = None

    def submit(self, checkpoint_id: int, committables: dict[str, list[Any]]) -> None:
        """Queue the committables of completed checkpoint ``checkpoint_id`` (by sink uid)."""
        if not self.committers:
            return
        with self._lock:
            if self._closed:
                return
            self._queue.append((checkpoint_id, {uid: committables.get(uid, []) for uid in self.committers}))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="global-commits", daemon=True)
                self._thread.start()
            self._lock.notify_all()

    def uncommitted(self) -> dict[str, CommitGroups]:
        """Per sink, the queued (or in-progress) checkpoints' committables, oldest first."""
        with self._lock:
            out: dict[str, CommitGroups] = {}
            for cid, by_sink in self._queue:
                for uid, comms in by_sink.items():
                    if comms:
                        out.setdefault(uid, []).append((cid, list(comms)))
            return out

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every queued checkpoint is committed (or a commit failed); True if drained."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._queue and self._failed is None and not self._closed:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._lock.wait(left)
            return not self._queue

    def close(self, timeout: float = 60.0) -> None:
        """Commit nothing more; wait for a commit in progress to return."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                log.warning("a global commit still runs after %.0fs; the next attempt commits again", timeout)

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._lock.wait()
                if self._closed or self._failed is not None:
                    return
                cid, by_sink = self._queue[0]
            try:
                for uid, commit in self.committers.items():
                    t0 = time.perf_counter()
                    commit(cid, by_sink.get(uid, []))
                    self.observe(uid, time.perf_counter() - t0)
            except BaseException as exc:  # a simulated crash too: the attempt must end
                with self._lock:
                    self._failed = exc
                    self._lock.notify_all()
                self.on_fatal(exc)
                return
            with self._lock:
                self._queue.popleft()
                self._lock.notify_all()
