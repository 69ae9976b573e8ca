"""The reader's fetch thread: consumes ahead of the task, within a byte budget.

librdkafka and pyarrow release the GIL, so one thread can ``consume()`` and decode a batch
(:mod:`.prepared`) while the task thread writes the previous one. The fetch thread never touches split positions:
the task thread advances them only for what it emitted, so a checkpoint holds exactly the next offsets
after the emitted records, however far the fetch thread has read (what it fetched beyond is simply read
again after a restore).

Every other consumer call (assign, unassign, commit, watermark queries) runs in the fetch thread too,
between two ``consume()`` calls (:meth:`Fetcher.call`): librdkafka serves assignment changes through the
queue ``consume()`` polls, so an ``incremental_assign`` from another thread waits for a ``consume()`` that
never yields to it.

Memory is bounded: the hand-over queue holds at most ``max_bytes`` of values (at least one batch); when it
is full the thread stops calling ``consume()``, librdkafka's own queue (``queued.max.messages.kbytes``,
the other half of the reader's ``max_prefetch_bytes``) fills and librdkafka stops fetching. A slow sink
therefore stops the fetching within the budget.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Fetched", "Fetcher", "split_messages"]

_CONSUME_TIMEOUT_S = 0.02


@dataclass
class Fetched:
    """One ``consume()`` result, split for the task thread.

    Attributes:
        msgs: the data messages, in order.
        values: their values.
        parts: their partitions (int32).
        offsets: their offsets (int64).
        nbytes: bytes of the values (what the budget counts).
        events: error and end-of-partition events, which follow the data they came after.
    """

    msgs: list[Any]
    values: list[bytes | None]
    parts: np.ndarray
    offsets: np.ndarray
    nbytes: int
    events: list[Any] = field(default_factory=list)

    @property
    def count(self) -> int:
        """The number of data messages."""
        return len(self.msgs)


def split_messages(msgs: list[Any]) -> Fetched:
    """Separate data from events and extract the columns the reader needs (no per-message attribute
    lookups: unbound accessors through ``map``)."""
    cls = type(msgs[0])
    events: list[Any] = []
    if any(map(cls.error, msgs)):
        events = [m for m in msgs if m.error() is not None]
        msgs = [m for m in msgs if m.error() is None]
    values = list(map(cls.value, msgs))
    n = len(msgs)
    return Fetched(
        msgs,
        values,
        np.fromiter(map(cls.partition, msgs), dtype=np.int32, count=n),
        np.fromiter(map(cls.offset, msgs), dtype=np.int64, count=n),
        sum(map(len, filter(None, values))),
        events,
    )


class Fetcher:
    """Runs ``consume`` in a daemon thread and hands the prepared results over through a bounded queue.

    Args:
        consume: ``consumer.consume`` (``(num_messages, timeout) -> messages``).
        prepare: turns a ``consume()`` result into the item handed over (it has ``count`` and ``nbytes``);
            runs in the fetch thread.
        batch_size: messages per ``consume`` call.
        max_bytes: budget of fetched-but-not-taken values (one batch always fits).
        name: thread name suffix.
    """

    def __init__(
        self,
        consume: Callable[[int, float], list[Any]],
        prepare: Callable[[list[Any]], Any],
        batch_size: int,
        max_bytes: int,
        name: str,
    ) -> None:
        self._consume = consume
        self._prepare = prepare
        self._batch_size = batch_size
        self._max_bytes = max_bytes
        self._queue: deque[Any] = deque()
        self._bytes = 0
        self._cv = threading.Condition()
        self._stopping = False
        self._error: BaseException | None = None
        self._commands: deque[tuple[Callable[[], Any], Future[Any]]] = deque()
        #: records fetched and handed over in total (the task's emitted count trails it)
        self.fetched_records = 0
        self._thread = threading.Thread(target=self._run, name=f"sluice-kafka-fetch-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def queued_bytes(self) -> int:
        """Bytes of values fetched and not taken yet."""
        return self._bytes

    @property
    def queued_records(self) -> int:
        """Records fetched and not taken yet."""
        with self._cv:
            return sum(f.count for f in self._queue)

    def call(self, fn: Callable[[], Any]) -> Future[Any]:
        """Run ``fn`` (a consumer call) in the fetch thread before its next ``consume()``."""
        fut: Future[Any] = Future()
        with self._cv:
            if self._error is not None or self._stopping or not self._thread.is_alive():
                fut.set_exception(self._error or RuntimeError("the Kafka fetch thread is not running"))
                return fut
            self._commands.append((fn, fut))
            self._cv.notify_all()
        return fut

    def _run_commands(self) -> None:
        with self._cv:
            commands = list(self._commands)
            self._commands.clear()
        for fn, fut in commands:
            try:
                fut.set_result(fn())
            except Exception as exc:
                fut.set_exception(exc)

    def _run(self) -> None:
        try:
            while True:
                with self._cv:
                    while self._bytes >= self._max_bytes and not self._stopping and not self._commands:
                        self._cv.wait()  # backpressure: no consume() until the task takes a batch
                    stopping = self._stopping
                self._run_commands()
                if stopping:
                    return
                if self._bytes >= self._max_bytes:
                    continue
                msgs = self._consume(self._batch_size, _CONSUME_TIMEOUT_S)
                if not msgs:
                    continue
                item = self._prepare(msgs)
                with self._cv:
                    if self._stopping:
                        return
                    self._queue.append(item)
                    self._bytes += item.nbytes
                    self.fetched_records += item.count
                    self._cv.notify_all()
        except BaseException as exc:  # handed to the task thread, which raises it
            with self._cv:
                self._error = exc
                for _, fut in self._commands:
                    fut.set_exception(exc)
                self._commands.clear()
                self._cv.notify_all()

    def take(self, timeout_s: float) -> Any:
        """The oldest prepared batch, or None if none came within ``timeout_s``; re-raises a failure of the
        thread once the batches before it are taken."""
        with self._cv:
            if not self._queue and self._error is None:
                self._cv.wait(timeout_s)
            if not self._queue:
                if self._error is not None:
                    raise self._error
                return None
            item = self._queue.popleft()
            self._bytes -= item.nbytes
            self._cv.notify_all()
            return item

    def stop(self) -> None:
        """Stop the thread and wait for it (it is inside ``consume`` for at most 20 ms); consumer calls
        still pending (an offset commit after the final checkpoint) run first."""
        with self._cv:
            self._stopping = True
            self._queue.clear()
            self._bytes = 0
            self._cv.notify_all()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
        if not self._thread.is_alive():
            self._run_commands()  # the thread died first: nobody else uses the consumer now
