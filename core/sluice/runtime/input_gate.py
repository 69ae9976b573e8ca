"""A task's input side (Flink ``SingleInputGate`` with ``CheckpointedInputGate`` and its network input).

The gate polls the task's input channels in round-robin order, one item per call, skipping channels that
are blocked for alignment or ended. Data batches go to the task; watermarks and watermark statuses go to
the watermark valve; barriers, announcements and cancel markers go to the barrier handler; an
``EndOfPartition`` removes its channel from alignment and from event time, and the last one ends the
task's input.

While the task's outputs are full it polls *events only* (an item is taken only where the channel's head
is an event), so barriers and cancel markers are seen under backpressure while no data moves.

After a restore with in-flight data (:meth:`InputGate.expect_recovered_data`), every sender first re-sends
its output channel state, then ``EndOfChannelState``. A channel that delivered it is *held* (nothing more is
taken from it, events included) until every channel did, as Flink's ``UpstreamRecoveryTracker`` blocks it.
A rescale can give a key (a Kafka partition, a key group) to another sender than the old sender's successor,
which re-sends the key's recovered records: the key's newer records (what its new sender makes of its input
channel state, then of new input) come on another channel, and must wait. The gate is
its barrier handler's input half (:class:`~sluice.checkpoint.barrier_handler.CheckpointableInput`): it
blocks and unblocks channels and pulls a queued barrier forward to the head of its channel
(timeout-adaptive checkpoints switching to unaligned).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from sluice.checkpoint.barrier_handler import BarrierHandler
from sluice.errors import CheckpointFailureReason
from sluice.events import (
    CancelCheckpointMarker,
    CheckpointAnnouncement,
    CheckpointBarrier,
    EndOfChannelState,
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
        #: after a restore with in-flight data: channels that have not delivered ``EndOfChannelState`` yet
        self.recovering_channels: set[int] = set()
        #: channels that delivered it while others have not: held until they all did
        self.held: set[int] = set()
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
            if i in self.blocked or i in self.ended or i in self.held:
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
            self.handler.on_cancel(channel, item.checkpoint_id, CheckpointFailureReason[item.failure])
        elif isinstance(item, EndOfChannelState):
            self._recovered(channel)
        elif isinstance(item, EndOfPartition):
            self.ended.add(channel)
            self.blocked.discard(channel)
            self.handler.on_end_of_partition(channel)
            self.valve.end_channel(channel)
            if len(self.ended) == len(self.channels):
                self._end_of_input()

    # -- recovery of a restored checkpoint's in-flight data ----------------------------------------------
    def expect_recovered_data(self) -> None:
        """Restored with in-flight data: every channel delivers ``EndOfChannelState`` after the data its
        sender recovered; until all did, those that did deliver nothing more."""
        self.recovering_channels = set(range(len(self.channels)))

    def _recovered(self, channel: int) -> None:
        if channel not in self.recovering_channels:
            raise RuntimeError(f"channel {channel} delivered EndOfChannelState twice, or without a restore")
        self.recovering_channels.discard(channel)
        if self.recovering_channels:
            self.held.add(channel)
        else:
            self.held.clear()  # every sender's recovered data is in: all channels flow again

    # -- CheckpointableInput: the barrier handler's input half ----------------------------------------
    def recovering(self) -> bool:
        """Some channel has not yet delivered the end of its sender's recovered in-flight data."""
        return bool(self.recovering_channels)

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
