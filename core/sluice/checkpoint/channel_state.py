"""Channel state of unaligned checkpoints (Flink ``ChannelStateWriter``).

An unaligned checkpoint persists the data its barriers overtook, so that a restore replays it:

* *output* channel state: the batches in a task's output queues that its priority barrier overtook
  (re-sent first after a restore);
* *input* channel state: the batches a priority barrier overtook in its own input channel, and the batches
  arriving on every other input channel after the snapshot until that channel delivers its barrier
  (processed before any new input after a restore).

:class:`ChannelStateRecorder` records the input side while a checkpoint waits for its remaining barriers.
Batches are kept as they are (Arrow buffers are immutable) and serialized as Arrow IPC streams in the
asynchronous part of the checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

__all__ = ["ChannelState", "ChannelStateRecorder", "read_ipc", "write_ipc"]


@dataclass
class ChannelState:
    """The in-flight data one checkpoint of one task persists."""

    #: (input channel, batch), in the order the batches were received
    input: list[tuple[int, pa.RecordBatch]] = field(default_factory=list)
    #: (output writer index, batch), in the order they were queued
    output: list[tuple[int, pa.RecordBatch]] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        """Bytes of in-flight data persisted (the checkpoint stats' ``inflight_bytes``)."""
        n: int = sum(b.nbytes for _, b in self.input) + sum(b.nbytes for _, b in self.output)
        return n

    def encode(self, input_index_of: list[int]) -> dict[str, list[tuple[int, bytes]]]:
        """The task-state payload entries; input batches are keyed by input index (not channel)."""
        return {
            "input_state": [(input_index_of[ch], write_ipc(b)) for ch, b in self.input],
            "output_state": [(idx, write_ipc(b)) for idx, b in self.output],
        }


class ChannelStateRecorder:
    """Records a task's input data into the channel state of the unaligned checkpoint in progress.

    At most one checkpoint records at a time (the barrier handler finishes or aborts a checkpoint before
    it starts the next). The task thread asks :attr:`recording` for every batch, so that test is a plain
    attribute.
    """

    def __init__(self) -> None:
        #: True while some checkpoint records (the channels it still records may all have stopped)
        self.recording = False
        self._checkpoint_id = 0
        self._state: ChannelState | None = None
        self._channels: set[int] = set()

    def start(
        self, checkpoint_id: int, state: ChannelState, channels: set[int], overtaken: dict[int, list[Any]]
    ) -> None:
        """Persist the input each barrier overtook, then record ``channels`` until :meth:`stop`."""
        for ch, batches in overtaken.items():
            state.input.extend((ch, b) for b in batches)
        self._checkpoint_id = checkpoint_id
        self._state = state
        self._channels = set(channels)
        self.recording = True

    def record(self, channel: int, batch: pa.RecordBatch) -> None:
        """``batch`` arrived on ``channel``: it belongs to the checkpoint if the channel's barrier is due."""
        if self._state is not None and channel in self._channels:
            self._state.input.append((channel, batch))

    def stop(self, channel: int) -> None:
        """``channel`` delivered its barrier (or ended): what follows belongs to the next checkpoint."""
        self._channels.discard(channel)

    def finish(self) -> None:
        """Every channel delivered its barrier: the channel state is complete."""
        self._state = None
        self._channels = set()
        self.recording = False

    def abort(self, checkpoint_id: int) -> None:
        """Stop recording if ``checkpoint_id`` is the checkpoint recording."""
        if self._state is not None and self._checkpoint_id == checkpoint_id:
            self.finish()


def write_ipc(batch: pa.RecordBatch) -> bytes:
    """``batch`` as an Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    data: bytes = sink.getvalue().to_pybytes()
    return data


def read_ipc(data: bytes) -> pa.RecordBatch:
    """Inverse of :func:`write_ipc`."""
    return pa.ipc.open_stream(data).read_next_batch()
