"""The thread that runs a subtask's asynchronous checkpoint parts, in order, and how it stops.

Flink runs each checkpoint's asynchronous part as an ``AsyncCheckpointRunnable`` and, before a task
disposes of its operators (and their state backends), waits for the runnables of a task that finished, or
cancels those of a task that failed. :class:`AsyncUploads` is that for one subtask: one thread, started
with the first upload, that runs uploads in submission order. :meth:`AsyncUploads.stop` drops the uploads
not started yet, optionally asks the running one to stop at its next step (:attr:`AsyncUploads.cancelled`),
and waits, bounded, for the thread to end; a thread that does not end in time is named in a warning. A
task cancels its uploads whether it finished or failed (a finished task's later checkpoints use its final
state, so its running upload has nothing left to give).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["AsyncUploads", "UploadCancelled"]

log = logging.getLogger("sluice.task")

T = TypeVar("T")


class UploadCancelled(Exception):
    """Raised inside an upload that :meth:`AsyncUploads.stop` cancelled: it ends without a response."""


class AsyncUploads(Generic[T]):
    """Runs ``run(item)`` for each submitted item on one thread named ``name``, in submission order.

    Args:
        name: The thread's name (``upload-<subtask>``: logs and warnings name it).
        run: The asynchronous part of one checkpoint.
        discard: Releases what an item holds when it will never run (dropped by :meth:`stop`).
    """

    def __init__(self, name: str, run: Callable[[T], None], discard: Callable[[T], None]) -> None:
        self.name = name
        self._run = run
        self._discard = discard
        self._queue: deque[T] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closing = False
        self._cancelled = False

    @property
    def closing(self) -> bool:
        """:meth:`stop` was called: nothing new starts."""
        return self._closing

    @property
    def cancelled(self) -> bool:
        """The running upload should stop at its next step (see :meth:`check`)."""
        return self._cancelled

    def check(self) -> None:
        """Called by an upload between its steps: raises :class:`UploadCancelled` once cancelled."""
        if self._cancelled:
            raise UploadCancelled(f"{self.name}: cancelled")

    def submit(self, item: T) -> None:
        """Run ``item`` after the uploads submitted before it; dropped at once if stopping."""
        with self._cond:
            if not self._closing:
                self._queue.append(item)
                if self._thread is None:
                    self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                    self._thread.start()
                self._cond.notify()
                return
        self._discard(item)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return  # closing and nothing left
                item = self._queue.popleft()
            self._run(item)

    def stop(self, cancel: bool, timeout: float) -> bool:
        """Start nothing new, drop what has not started, and wait up to ``timeout`` seconds for the running
        upload to end.

        Args:
            cancel: Ask the running upload to stop at its next step; else it runs to its end.
            timeout: Seconds to wait for the thread.

        Returns:
            True if no upload thread is left running.
        """
        with self._cond:
            self._closing = True
            self._cancelled = self._cancelled or cancel
            dropped = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
            thread = self._thread
        for item in dropped:
            self._discard(item)
        if thread is None or thread is threading.current_thread():
            return True
        thread.join(timeout)
        if thread.is_alive():
            log.warning(
                "%s did not stop within %.0fs after its task ended: it may still write checkpoint files "
                "(it is not waited for any longer)", thread.name, timeout,
            )  # fmt: skip
            return False
        return True

    def alive(self) -> list[str]:
        """The name of the upload thread if it is still running."""
        t = self._thread
        return [t.name] if t is not None and t.is_alive() else []

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the thread to end (after :meth:`stop`); True if it did."""
        t = self._thread
        if t is None or t is threading.current_thread():
            return True
        t.join(timeout)
        return not t.is_alive()
