"""Channels between subtasks, with credit-based flow control and priority events.

A channel connects one sender subtask to one receiver subtask. Data sits in two known queues:

* the **output queue** on the sender side: batches the receiver has not granted credit for yet;
* the **input queue** on the receiver side: at most ``credits`` batches.

A data batch moves from the output to the input queue only against a credit; the receiver returns one
credit per batch it consumes. Events (barriers, watermarks, cancel markers, end of partition) need no
credit, but keep their order behind data. A *priority* event (an unaligned barrier, an announcement)
overtakes both queues and is delivered at the head of the input queue; the sender learns which output
batches it overtook, which become the sender's output channel state.

Every task owns one :class:`Signal` (a condition variable): its inputs, its mailbox and the channels it
sends to all wake it through it. Locks are only ever taken receiver-then-sender, and wake-ups happen after
releasing, so the DAG of channels cannot deadlock.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import pyarrow as pa

from sluice.events import CheckpointBarrier, EndOfPartition

__all__ = ["InputChannel", "LocalChannel", "OutputChannel", "Signal"]


class Signal:
    """A task's wake-up: one condition shared by its input channels, mailbox and output availability."""

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        self._pending = False

    def notify(self) -> None:
        with self.cond:
            self._pending = True
            self.cond.notify_all()

    def wait(self, timeout: float) -> None:
        """Sleep until notified or ``timeout`` passed; returns at once if a notification is pending."""
        with self.cond:
            if not self._pending:
                self.cond.wait(timeout)
            self._pending = False


class OutputChannel(Protocol):
    """The sender's end of a channel."""

    def send(self, item: Any) -> None:
        """Queue a data batch or an in-order event."""

    def send_priority(self, event: Any) -> list[pa.RecordBatch]:
        """Deliver ``event`` ahead of all queued data; return the output-queue batches it overtook."""

    def is_available(self) -> bool:
        """True if the output queue has room (the sender may produce more)."""

    def queued_output(self) -> int:
        """Batches in the output queue."""


class InputChannel(Protocol):
    """The receiver's end of a channel."""

    def poll(self) -> Any | None:
        """The next item, or None if the input queue is empty."""

    def has_input(self) -> bool: ...

    def head_is_event(self) -> bool:
        """True if the next item is an event (seen even while the task is backpressured)."""

    def queued_input(self) -> int:
        """Items in the input queue (diagnostics)."""

    def take_overtaken(self) -> list[pa.RecordBatch]:
        """Data batches queued behind a priority barrier that was just polled (input channel state)."""

    def find_barrier(self, checkpoint_id: int) -> list[pa.RecordBatch] | None:
        """If barrier ``checkpoint_id`` is queued (input or output queue), move it to the head and return the
        batches it overtook; None if it is not queued."""


def _scan_for_barrier(queue: deque[Any], checkpoint_id: int) -> tuple[int | None, bool]:
    """(index of aligned barrier ``checkpoint_id`` in ``queue`` or None, whether the search ends here).

    It ends at the channel's EndOfPartition, and at a barrier that already has priority (it reports what
    it overtook when it is polled).
    """
    for i, x in enumerate(queue):
        if isinstance(x, CheckpointBarrier) and x.checkpoint_id == checkpoint_id:
            return (None, True) if x.options.is_unaligned else (i, True)
        if isinstance(x, EndOfPartition):
            return None, True
    return None, False


def _data(items: Any) -> list[pa.RecordBatch]:
    return [x for x in items if isinstance(x, pa.RecordBatch)]


class InputQueue:
    """The receiver side every channel shares: the input queue, priority insertion and overtaken input.

    Subclasses set ``_lock`` and call ``_insert_priority`` / ``_polled`` with it held.
    """

    def __init__(self) -> None:
        self._input: deque[Any] = deque()
        self._overtaken: list[pa.RecordBatch] = []
        self._input_overtaken: dict[int, list[pa.RecordBatch]] = {}

    def has_input(self) -> bool:
        return bool(self._input)

    def head_is_event(self) -> bool:
        head = self._input[0] if self._input else None
        return head is not None and not isinstance(head, pa.RecordBatch)

    def queued_input(self) -> int:
        return len(self._input)

    def take_overtaken(self) -> list[pa.RecordBatch]:
        out, self._overtaken = self._overtaken, []
        return out

    def _insert_priority(self, event: Any) -> None:
        if isinstance(event, CheckpointBarrier):
            # what it overtakes in the input queue is fixed now: data queued later comes after it
            self._input_overtaken[event.checkpoint_id] = _data(self._input)
        self._input.appendleft(event)

    def _polled(self, item: Any) -> None:
        if isinstance(item, CheckpointBarrier) and item.options.is_unaligned:
            self._overtaken = self._input_overtaken.pop(item.checkpoint_id, [])

    def _pull_from_input(self, checkpoint_id: int) -> tuple[list[pa.RecordBatch] | None, bool]:
        """Move aligned barrier ``checkpoint_id`` from the input queue to its head as a priority barrier.

        Returns (the batches it overtook or None if not pulled, whether the search ends here).
        """
        i, done = _scan_for_barrier(self._input, checkpoint_id)
        if i is None:
            return None, done
        barrier = self._input[i]
        ahead = _data(list(self._input)[:i])
        del self._input[i]
        self._input.appendleft(barrier.as_unaligned())
        return ahead, True


class LocalChannel(InputQueue):
    """An in-process channel: both ends in one object, guarded by the receiver's signal lock."""

    def __init__(self, receiver: Signal, credits: int = 4, output_capacity: int = 4) -> None:
        super().__init__()
        self._recv = receiver
        self._lock = receiver.cond
        self._credits = credits
        self._out_capacity = output_capacity
        self._output: deque[Any] = deque()
        self._in_data = 0  # data batches in the input queue (the credit in use)
        self._out_data = 0  # data batches in the output queue
        self.sender_wakeup: Callable[[], None] | None = None

    # -- sender side ---------------------------------------------------------------------------------
    def send(self, item: Any) -> None:
        is_data = isinstance(item, pa.RecordBatch)
        with self._lock:
            if not self._output and (not is_data or self._in_data < self._credits):
                self._input.append(item)
                if is_data:
                    self._in_data += 1
            else:
                self._output.append(item)
                if is_data:
                    self._out_data += 1
        self._recv.notify()

    def send_priority(self, event: Any) -> list[pa.RecordBatch]:
        with self._lock:
            overtaken = _data(self._output)
            self._insert_priority(event)
        self._recv.notify()
        return overtaken

    def is_available(self) -> bool:
        return self._out_data < self._out_capacity

    def queued_output(self) -> int:
        return self._out_data

    # -- receiver side -------------------------------------------------------------------------------
    def poll(self) -> Any | None:
        wake = False
        with self._lock:
            if not self._input:
                return None
            item = self._input.popleft()
            if isinstance(item, pa.RecordBatch):
                self._in_data -= 1
                wake = self._refill()
            else:
                self._polled(item)
        if wake and self.sender_wakeup is not None:
            self.sender_wakeup()
        return item

    def _refill(self) -> bool:
        """Move output-queue items into the input queue while credit allows. Caller holds the lock."""
        moved = False
        while self._output:
            head = self._output[0]
            is_data = isinstance(head, pa.RecordBatch)
            if is_data and self._in_data >= self._credits:
                break
            self._input.append(self._output.popleft())
            if is_data:
                self._in_data += 1
                self._out_data -= 1
                moved = True
        return moved

    def find_barrier(self, checkpoint_id: int) -> list[pa.RecordBatch] | None:
        with self._lock:
            ahead, done = self._pull_from_input(checkpoint_id)
            if done:
                return ahead
            # still in the sender's output queue: everything queued before it, on both sides, was overtaken
            i, _ = _scan_for_barrier(self._output, checkpoint_id)
            if i is None:
                return None
            barrier = self._output[i]
            ahead = _data(self._input) + _data(list(self._output)[:i])
            del self._output[i]
            self._input.appendleft(barrier.as_unaligned())
            return ahead
        return None
