"""Where a task's data goes (Flink ``RecordWriter``, ``ChainingOutput`` and a source's ``ReaderOutput``).

* :class:`RecordWriter` sends a vertex's output over one exchange: it partitions data batches over the
  exchange's channels and broadcasts events, in order or (priority) ahead of queued data.
* :class:`ChainOutput` is the collector of one chain position: the next chained operator, or the writers
  of the vertex's outputs after the last one.
* :class:`SourceOutput` is what a source reader emits into: the head operator of the source's chain, and
  the task's watermark valve for event time and idleness.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from sluice.events import Watermark, WatermarkStatus
from sluice.operators.base import MIN_WATERMARK, Operator
from sluice.runtime.channels import OutputChannel
from sluice.runtime.partitioners import Partitioner
from sluice.runtime.task_metrics import TaskMetrics
from sluice.runtime.watermarks import StatusWatermarkValve

__all__ = ["ChainOutput", "RecordWriter", "SourceOutput", "split_rows"]


def split_rows(batch: pa.RecordBatch, max_rows: int) -> list[pa.RecordBatch]:
    """``batch`` in slices of at most ``max_rows`` rows (all of it if ``max_rows`` <= 0).

    Bounded slices bound how long a task is busy with one batch, so a barrier behind it waits less.
    """
    if max_rows <= 0 or batch.num_rows <= max_rows:
        return [batch]
    return [batch.slice(i, max_rows) for i in range(0, batch.num_rows, max_rows)]


class RecordWriter:
    """Sends a vertex's output over one exchange: partitions batches, broadcasts events.

    Args:
        partitioner: Decides which channel receives which rows of a batch.
        channels: The exchange's output channels, one per receiving subtask, in subtask order.
        unaligned_ok: Barriers may overtake data on this exchange (see ``JobEdge.unaligned_ok``).
    """

    def __init__(
        self,
        partitioner: Partitioner,
        channels: list[OutputChannel],
        unaligned_ok: bool = True,
        counted: bool = True,
    ) -> None:
        self.partitioner = partitioner
        self.channels = channels
        #: priority barriers and announcements may go ahead of queued data on this exchange
        self.supports_unaligned = unaligned_ok and partitioner.supports_unaligned
        #: what :meth:`emit` sent (rows, Arrow bytes, batches), for the task's metrics
        self.records_out = self.bytes_out = self.batches_out = 0
        if not counted:  # the job runs without metrics: no counting at all
            self.emit = self._send  # type: ignore[method-assign]

    def emit(self, batch: pa.RecordBatch) -> None:
        """Send the rows of ``batch`` to the channels the partitioner picks."""
        self.records_out += batch.num_rows
        self.bytes_out += batch.get_total_buffer_size()
        self.batches_out += 1
        self._send(batch)

    def _send(self, batch: pa.RecordBatch) -> None:
        for i, part in self.partitioner.partition(batch, len(self.channels)):
            self.channels[i].send(part)

    def broadcast(self, event: Any) -> None:
        """Send ``event`` in order (behind queued data) on every channel."""
        for ch in self.channels:
            ch.send(event)

    def broadcast_priority(self, event: Any) -> list[pa.RecordBatch]:
        """Send ``event`` ahead of queued data on every channel; return the overtaken batches."""
        out: list[pa.RecordBatch] = []
        for ch in self.channels:
            out.extend(ch.send_priority(event))
        return out

    def is_available(self) -> bool:
        """True if every channel has room for another batch."""
        return all(ch.is_available() for ch in self.channels)


class ChainOutput:
    """Collector of chain position i: the next operator, or the writers of the vertex's outputs.

    Args:
        nxt: The next operator of the chain, or None at the chain's end.
        main: The writers of the vertex's main output (used only at the chain's end).
        side: The writers of each side output tag of this chain position.
    """

    def __init__(
        self, nxt: Operator | None, main: list[RecordWriter], side: dict[str, list[RecordWriter]]
    ) -> None:
        self.nxt = nxt
        self.main = main
        self.side = side
        self.watermark = MIN_WATERMARK
        #: rows sent to each side output tag (dead letters ...), for the task's metrics
        self.side_records: dict[str, int] = {}

    def emit(self, batch: pa.RecordBatch) -> None:
        """Pass a non-empty batch on."""
        if batch.num_rows == 0:
            return
        if self.nxt is not None:
            self.nxt.process_batch(batch, 0)
        else:
            for w in self.main:
                w.emit(batch)

    def emit_side(self, tag: str, batch: pa.RecordBatch) -> None:
        """Send ``batch`` to the side output ``tag``.

        Raises:
            RuntimeError: No stream reads side output ``tag`` (its records would be lost).
        """
        writers = self.side.get(tag)
        if not writers:
            raise RuntimeError(f"side output {tag!r} is not connected: its records would be lost")
        self.side_records[tag] = self.side_records.get(tag, 0) + batch.num_rows
        for w in writers:
            w.emit(batch)

    def has_side(self, tag: str) -> bool:
        """True if a stream reads side output ``tag``."""
        return bool(self.side.get(tag))

    def emit_watermark(self, timestamp: int) -> None:
        """Pass the watermark on if it advances this position's event time."""
        if timestamp <= self.watermark:
            return
        self.watermark = timestamp
        if self.nxt is not None:
            self.nxt.process_watermark(timestamp)
        else:
            for w in self.main:
                w.broadcast(Watermark(timestamp))


class SourceOutput:
    """The ``ReaderOutput`` of a source task: batches into the head operator, event time into the valve.

    Args:
        head: The first operator of the source's chain.
        writers: Every writer of the task (they learn of the reader's idleness).
        valve: The task's watermark valve.
        max_batch_rows: Batches are split into slices of at most this many rows (0: never split).
        fault: The task's fault-injection hook (point ``"source"`` before each slice).
        metrics: The task's metrics (the reader's batches are the task's input), or None.
    """

    def __init__(
        self,
        head: Operator,
        writers: list[RecordWriter],
        valve: StatusWatermarkValve,
        max_batch_rows: int,
        fault: Callable[[str], None],
        metrics: TaskMetrics | None = None,
    ) -> None:
        self._head = head
        self._writers = writers
        self._valve = valve
        self._max_rows = max_batch_rows
        self._fault = fault
        self._metrics = metrics

    def emit(self, batch: pa.RecordBatch) -> None:
        """A batch read by the source reader."""
        if self._metrics is not None:
            self._metrics.count_in(batch.num_rows, batch.get_total_buffer_size())
        for part in split_rows(batch, self._max_rows):
            self._fault("source")
            self._head.process_batch(part, 0)

    def emit_side(self, tag: str, batch: pa.RecordBatch) -> None:
        """A batch for the side output ``tag`` (e.g. records the reader could not decode)."""
        self._head.output.emit_side(tag, batch)

    def emit_watermark(self, timestamp_ms: int) -> None:
        """The reader's event time reached ``timestamp_ms``."""
        self._valve.source_watermark(timestamp_ms)

    def mark_idle(self) -> None:
        """The reader is idle; downstream leaves it out of the watermark minimum."""
        if self._valve.mark_source_idle():
            for w in self._writers:
                w.broadcast(WatermarkStatus(idle=True))
