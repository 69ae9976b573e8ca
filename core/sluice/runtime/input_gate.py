"""A task's input side (Flink ``SingleInputGate`` with ``CheckpointedInputGate`` and its network input).

The gate polls the task's input channels in round-robin order, one item per call, skipping channels that
are blocked for alignment or ended. Data batches go to the task; watermarks and watermark statuses go to
the watermark valve; barriers, announcements and cancel markers go to the barrier handler; an
``EndOfPartition`` removes its channel from alignment and from event time, and the last one ends the
task's input.

While the task's outputs are full it polls *events only* (an item is taken only where the channel's head
is an event), so barriers and cancel markers are seen under backpressure while no data moves. The gate is
its barrier handler's input half (:class:`~sluice.checkpoint.barrier_handler.CheckpointableInput`): it
blocks and unblocks channels and pulls a queued barrier forward to the head of its channel
(timeout-adaptive checkpoints switching to unaligned).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from sluice.checkpoint.barrier_handler import BarrierHandler
from sluice.events import (
    CancelCheckpointMarker,
    CheckpointAnnouncement,
    CheckpointBarrier,
    EndOfPartition,
    Watermark,
    WatermarkStatus,
)
from sluice.runtime.channels import InputChannel
from sluice.runtime.watermarks import StatusWatermarkValve

__all__ = ["InputGate"]


class InputGate:
    """Round-robin polling over a task's input channels, with alignment blocking and event dispatch.

    Args:
        channels: The input channels, numbered as the barrier handler numbers them.
        handler: Builds the task's barrier handler, whose input half is this gate
            (:func:`~sluice.checkpoint.barriers.barrier_handler`).
        valve: The task's watermark valve.
        process: Called with (channel, batch) for every data batch.
        end_of_input: Called once, when the last channel delivered ``EndOfPartition``.
        fault: The task's fault-injection hook (point ``"align"`` before a barrier that leaves the task
            still aligning).
    """

    def __init__(
        self,
        channels: list[InputChannel],
        handler: Callable[[InputGate], BarrierHandler],
        valve: StatusWatermarkValve,
        process: Callable[[int, pa.RecordBatch], None],
        end_of_input: Callable[[], None],
        fault: Callable[[str], None],
    ) -> None:
        self.channels = channels
        self.valve = valve
        self._process = process
        self._end_of_input = end_of_input
        self._fault = fault
        #: channels that delivered the barrier of the checkpoint aligning and wait for the others
        self.blocked: set[int] = set()
        #: channels that delivered EndOfPartition
        self.ended: set[int] = set()
        self._next = 0
        self.handler = handler(self)

    def poll(self, events_only: bool = False) -> bool:
        """Take and handle one item from the next channel that has one; False if none had.

        Args:
            events_only: Take an item only if it is an event (the task's outputs are full).
        """
        channels = self.channels
        n = len(channels)
        for k in range(n):
            i = (self._next + k) % n
            if i in self.blocked or i in self.ended:
                continue
            ch = channels[i]
            if not ch.has_input():
                continue
            if events_only and not ch.head_is_event():
                continue
            item = ch.poll()
            if item is None:
                continue
            self._next = i + 1
            if isinstance(item, pa.RecordBatch):
                self._process(i, item)
            else:
                self._on_event(i, item)
            return True
        return False

    def _on_event(self, channel: int, item: Any) -> None:
        if isinstance(item, Watermark):
            self.valve.input_watermark(channel, item.timestamp)
        elif isinstance(item, WatermarkStatus):
            self.valve.input_status(channel, item.idle)
        elif isinstance(item, CheckpointBarrier):
            self.valve.input_event(channel)
            overtaken = self.channels[channel].take_overtaken() if item.options.is_unaligned else None
            h = self.handler
            if len(h.live - h.received) > 1:
                self._fault("align")
            h.on_barrier(channel, item, overtaken)
        elif isinstance(item, CheckpointAnnouncement):
            self.handler.on_announcement(channel, item.barrier)
        elif isinstance(item, CancelCheckpointMarker):
            self.handler.on_cancel(channel, item.checkpoint_id)
        elif isinstance(item, EndOfPartition):
            self.ended.add(channel)
            self.blocked.discard(channel)
            self.handler.on_end_of_partition(channel)
            self.valve.end_channel(channel)
            if len(self.ended) == len(self.channels):
                self._end_of_input()

    # -- CheckpointableInput: the barrier handler's input half ----------------------------------------
    def block(self, channel: int) -> None:
        """Take no more input from ``channel`` until :meth:`unblock_all` (aligned checkpoints)."""
        self.blocked.add(channel)

    def unblock_all(self) -> None:
        """Alignment is over: every channel delivers input again."""
        self.blocked.clear()

    def pull_barrier_forward(self, channel: int, checkpoint_id: int) -> list[pa.RecordBatch] | None:
        """Move barrier ``checkpoint_id`` to the head of ``channel``; the input it overtook, None if absent."""
        return self.channels[channel].find_barrier(checkpoint_id)

    def queued(self) -> list[int]:
        """Items queued at each channel (for diagnostics)."""
        return [ch.queued_input() for ch in self.channels]
