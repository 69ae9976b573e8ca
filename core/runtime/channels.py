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


class LocalChannel:
    """An in-process channel: both ends in one object, guarded by the receiver's signal lock."""

    def __init__(self, receiver: Signal, credits: int = 4, output_capacity: int = 4) -> None:
        self._recv = receiver
        self._lock = receiver.cond
        self._credits = credits
        self._out_capacity = output_capacity
        self._input: deque[Any] = deque()
        self._output: deque[Any] = deque()
        self._in_data = 0  # data batches in the input queue (the credit in use)
        self._out_data = 0  # data batches in the output queue
        self.sender_wakeup: Callable[[], None] | None = None
        self._overtaken: list[pa.RecordBatch] = []
        self._input_overtaken: dict[int, list[pa.RecordBatch]] = {}

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
            overtaken = [x for x in self._output if isinstance(x, pa.RecordBatch)]
            if isinstance(event, CheckpointBarrier):
                # what it overtakes in the input queue is fixed now: data queued later comes after it
                self._input_overtaken[event.checkpoint_id] = [x for x in self._input if isinstance(x, pa.RecordBatch)]
            self._input.appendleft(event)
        self._recv.notify()
        return overtaken

    def is_available(self) -> bool:
        return self._out_data < self._out_capacity

    def queued_output(self) -> int:
        return self._out_data

    # -- receiver side -------------------------------------------------------------------------------
    def has_input(self) -> bool:
        return bool(self._input)

    def head_is_event(self) -> bool:
        head = self._input[0] if self._input else None
        return head is not None and not isinstance(head, pa.RecordBatch)

    def queued_input(self) -> int:
        return len(self._input)

    def poll(self) -> Any | None:
        wake = False
        with self._lock:
            if not self._input:
                return None
            item = self._input.popleft()
            if isinstance(item, pa.RecordBatch):
                self._in_data -= 1
                wake = self._refill()
            elif isinstance(item, CheckpointBarrier) and item.options.is_unaligned:
                self._overtaken = self._input_overtaken.pop(item.checkpoint_id, [])
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

    def take_overtaken(self) -> list[pa.RecordBatch]:
        out, self._overtaken = self._overtaken, []
        return out

    def find_barrier(self, checkpoint_id: int) -> list[pa.RecordBatch] | None:
        with self._lock:
            for queue_index, queue in enumerate((self._input, self._output)):
                for i, x in enumerate(queue):
                    if isinstance(x, CheckpointBarrier) and x.checkpoint_id == checkpoint_id:
                        if x.options.is_unaligned:
                            return None  # already a priority barrier: it reports what it overtook when polled
                        ahead = [y for y in list(self._input) if isinstance(y, pa.RecordBatch)]
                        if queue_index == 1:
                            ahead += [y for y in list(self._output)[:i] if isinstance(y, pa.RecordBatch)]
                            del self._output[i]
                        else:
                            ahead = ahead[
                                : sum(1 for y in list(self._input)[:i] if isinstance(y, pa.RecordBatch))
                            ]
                            del self._input[i]
                        self._input.appendleft(x.as_unaligned())
                        return ahead
                    if isinstance(x, EndOfPartition):
                        return None
        return None
