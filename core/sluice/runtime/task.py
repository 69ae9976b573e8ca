"""A task: one subtask of a job vertex, running its operator chain in one thread with a mailbox.

Everything that touches operators happens on the task thread: input batches, barriers, timers, and the
control messages the coordinator posts to the mailbox (trigger, complete, abort, split assignment). The
only other thread is the asynchronous part of checkpoints, which serializes frozen snapshots and uploads
them, then acknowledges.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa

from sluice.checkpoint.barriers import BarrierHandler
from sluice.checkpoint.payload import encode_task_state
from sluice.checkpoint.storage import CheckpointStorage
from sluice.events import (
    AlignmentMode,
    CancelCheckpointMarker,
    CheckpointAnnouncement,
    CheckpointBarrier,
    EndOfPartition,
    Watermark,
    WatermarkStatus,
)
from sluice.graph import SubtaskId
from sluice.runtime.channels import InputChannel, OutputChannel, Signal
from sluice.runtime.fault_hook import NO_FAULTS, FaultHook
from sluice.runtime.operators import MIN_WATERMARK, Operator, OperatorContext, OperatorSnapshot
from sluice.runtime.partitioners import Partitioner
from sluice.source import InputStatus, SourceReader, SourceSplit

__all__ = ["ChainOutput", "RecordWriter", "Task", "TaskGateway", "TaskRestore", "TaskStatus"]

log = logging.getLogger("sluice.task")


class TaskStatus(enum.Enum):
    RUNNING = "running"
    #: all input ended; waiting for a checkpoint taken after that to complete (the final checkpoint)
    WAITING_FOR_FINAL = "waiting_for_final_checkpoint"
    FINISHED = "finished"


class TaskGateway(Protocol):
    """How a task talks to the coordinator (a method call in-process, a TCP message on Spark)."""

    def acknowledge(self, task: SubtaskId, checkpoint_id: int, handle: dict[str, Any]) -> None: ...
    def decline(self, task: SubtaskId, checkpoint_id: int, reason: str) -> None: ...
    def end_of_input(self, task: SubtaskId) -> None: ...
    def finished(self, task: SubtaskId) -> None: ...
    def failed(self, task: SubtaskId, error: BaseException) -> None: ...
    def request_split(self, task: SubtaskId) -> None: ...


@dataclass
class TaskRestore:
    """What a subtask restores from a checkpoint (already redistributed for its index)."""

    checkpoint_id: int
    keyed: dict[str, dict[int, bytes]] = field(default_factory=dict)  # node uid -> key group -> blob
    operator: dict[str, list[Any]] = field(default_factory=dict)  # node uid -> operator states
    #: batches to process before any new input (input channel state), per input index
    replay_input: list[tuple[int, pa.RecordBatch]] = field(default_factory=list)
    #: batches to send before anything else (output channel state), per output writer index
    resend_output: list[tuple[int, pa.RecordBatch]] = field(default_factory=list)


class RecordWriter:
    """Sends a vertex's output over one exchange: partitions batches, broadcasts events."""

    def __init__(self, partitioner: Partitioner, channels: list[OutputChannel]) -> None:
        self.partitioner = partitioner
        self.channels = channels

    def emit(self, batch: pa.RecordBatch) -> None:
        for i, part in self.partitioner.partition(batch, len(self.channels)):
            self.channels[i].send(part)

    def broadcast(self, event: Any) -> None:
        for ch in self.channels:
            ch.send(event)

    def broadcast_priority(self, event: Any) -> list[pa.RecordBatch]:
        """Send ``event`` ahead of queued data on every channel; return the overtaken batches."""
        out: list[pa.RecordBatch] = []
        for ch in self.channels:
            out.extend(ch.send_priority(event))
        return out

    def is_available(self) -> bool:
        return all(ch.is_available() for ch in self.channels)


class ChainOutput:
    """Collector of chain position i: the next operator, or the writers of the vertex's outputs."""

    def __init__(
        self, nxt: Operator | None, main: list[RecordWriter], side: dict[str, list[RecordWriter]]
    ) -> None:
        self.nxt = nxt
        self.main = main
        self.side = side
        self.watermark = MIN_WATERMARK

    def emit(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        if self.nxt is not None:
            self.nxt.process_batch(batch, 0)
        else:
            for w in self.main:
                w.emit(batch)

    def emit_side(self, tag: str, batch: pa.RecordBatch) -> None:
        writers = self.side.get(tag)
        if not writers:
            raise RuntimeError(f"side output {tag!r} is not connected: its records would be lost")
        for w in writers:
            w.emit(batch)

    def emit_watermark(self, timestamp: int) -> None:
        if timestamp <= self.watermark:
            return
        self.watermark = timestamp
        if self.nxt is not None:
            self.nxt.process_watermark(timestamp)
        else:
            for w in self.main:
                w.broadcast(Watermark(timestamp))


@dataclass
class _PendingSnapshot:
    """A checkpoint between its synchronous snapshot and its acknowledgement."""

    barrier: CheckpointBarrier
    operators: dict[str, OperatorSnapshot]
    splits: list[SourceSplit] | None
    started: float
    sync_s: float
    unaligned: bool
    input_state: list[tuple[int, pa.RecordBatch]] = field(default_factory=list)
    output_state: list[tuple[int, pa.RecordBatch]] = field(default_factory=list)
    recording: set[int] = field(default_factory=set)
    alignment_s: float = 0.0
    switched: bool = False


class Task:
    """Runs one subtask. Create, then :meth:`start`; the coordinator drives it through the public methods."""

    def __init__(
        self,
        task_id: SubtaskId,
        name: str,
        operators: list[Operator],
        contexts: list[OperatorContext],
        inputs: list[InputChannel],
        input_edge_of_channel: list[int],
        input_unaligned_ok: bool,
        writers: dict[tuple[int, str | None], list[RecordWriter]],
        signal: Signal,
        gateway: TaskGateway,
        storage: CheckpointStorage,
        alignment: AlignmentMode,
        reader: SourceReader | None = None,
        restore: TaskRestore | None = None,
        faults: FaultHook = NO_FAULTS,
        max_batch_rows: int = 0,
    ) -> None:
        self.id = task_id
        self.name = f"{name} ({task_id.index + 1}/{contexts[0].parallelism})"
        self.operators = operators
        self.contexts = contexts
        self.inputs = inputs
        self.edge_of = input_edge_of_channel
        self.writers = writers
        self.all_writers = [w for ws in writers.values() for w in ws]
        self.signal = signal
        self.gateway = gateway
        self.storage = storage
        self.reader = reader
        self.restore = restore
        self.faults = faults
        self.max_batch_rows = max_batch_rows
        self.status = TaskStatus.RUNNING
        self._mailbox: deque[Callable[[], None]] = deque()
        self._mailbox_lock = threading.Lock()
        self._cancelled = False
        self._blocked: set[int] = set()
        self._ended: set[int] = set()
        self._channel_wm = [MIN_WATERMARK] * len(inputs)
        self._watermark = MIN_WATERMARK
        self._idle = False
        self._idle_channels: set[int] = set()
        self._rr = 0
        self._last_triggered = 0
        self._final_after: int | None = None  # first checkpoint snapshotted after end of input
        self._pending: dict[int, _PendingSnapshot] = {}
        self._uploads = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"upload-{task_id}")
        self._thread: threading.Thread | None = None
        self._async_error: BaseException | None = None
        self._recording: _PendingSnapshot | None = None
        if alignment is AlignmentMode.UNALIGNED and not input_unaligned_ok:
            alignment = AlignmentMode.ALIGNED  # a forward/broadcast input aligns (ARCHITECTURE.md 4)
        if alignment is AlignmentMode.ADAPTIVE and not input_unaligned_ok:
            alignment = AlignmentMode.ALIGNED
        self.alignment = alignment
        self.handler = BarrierHandler(len(inputs), self, alignment)
        self._timer_check = 0.0
        for ctx in contexts:
            ctx.fault_hook = self._fault

    # -- called from other threads (coordinator, transport) ------------------------------------------
    def post(self, action: Callable[[], None]) -> None:
        with self._mailbox_lock:
            self._mailbox.append(action)
        self.signal.notify()

    def trigger_checkpoint(self, barrier: CheckpointBarrier) -> None:
        """Coordinator: take checkpoint ``barrier`` now (sources, and tasks whose inputs all ended)."""
        self.post(lambda: self._on_trigger(barrier))

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.post(lambda: self._on_complete(checkpoint_id))

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self.post(lambda: self._on_aborted(checkpoint_id))

    def assign_splits(self, splits: list[SourceSplit]) -> None:
        assert self.reader is not None
        reader = self.reader
        self.post(lambda: reader.add_splits(splits))

    def no_more_splits(self) -> None:
        assert self.reader is not None
        self.post(self.reader.notify_no_more_splits)

    def cancel(self) -> None:
        self._cancelled = True
        self.signal.notify()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"task-{self.id}", daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def describe(self) -> str:
        """One line of diagnostics: status, alignment, queues (for logs and hung-job reports)."""
        queues = [ch.queued_input() for ch in self.inputs]
        outq = [ch.queued_output() for w in self.all_writers for ch in w.channels]
        return (
            f"{self.name}: {self.status.value} handler={self.handler.state_name} "
            f"current={self.handler.current.checkpoint_id if self.handler.current else None} "
            f"last_done={self.handler.last_done} blocked={sorted(self._blocked)} ended={sorted(self._ended)} "
            f"in={queues} out={outq} final_after={self._final_after} pending={sorted(self._pending)}"
        )

    # -- the task thread -----------------------------------------------------------------------------
    def _fault(self, point: str) -> None:
        self.faults.hit(point, self.name)

    def _run(self) -> None:
        try:
            self._initialize()
            self._loop()
            self._close()
        except _Cancelled:
            self._close(quiet=True)
        except BaseException as exc:
            self._close(quiet=True)
            if not self._cancelled:
                self.gateway.failed(self.id, exc)
        finally:
            self._uploads.shutdown(wait=False, cancel_futures=True)

    def _initialize(self) -> None:
        r = self.restore
        if r is not None:
            self._fault("restore")
        for op in self.operators:
            keyed = r.keyed.get(op.name, {}) if r else {}
            states = r.operator.get(op.name, []) if r else []
            op.initialize_state(keyed, states)
        for op in self.operators:
            op.open()
        if self.reader is not None:
            self.reader.start()
        if r is not None:
            # output channel state first, then input channel state, before any new input
            for idx, batch in r.resend_output:
                self.all_writers[idx].emit(batch)
            for input_index, batch in r.replay_input:
                self.operators[0].process_batch(batch, input_index)

    def _loop(self) -> None:
        while True:
            self._drain_mailbox()
            if self._cancelled:
                raise _Cancelled
            if self._async_error is not None:
                raise self._async_error
            if self.status is TaskStatus.FINISHED:
                return
            self._fire_timers()
            progressed = False
            if self.status is TaskStatus.RUNNING and self._outputs_available():
                progressed = self._poll_source() if self.reader is not None else self._poll_input()
            elif self.status is TaskStatus.RUNNING and self.reader is None and self.handler.in_progress:
                # backpressured, but barriers and events must still be seen
                progressed = self._poll_input(events_only=True)
            if not progressed:
                self.signal.wait(self._wait_timeout())

    def _wait_timeout(self) -> float:
        t = 0.05
        for op in self.operators:
            nxt = op.next_timer_ms()
            if nxt is not None:
                t = min(t, max(0.0, nxt / 1000 - time.time()))
        if self.handler.in_progress and self.alignment is AlignmentMode.ADAPTIVE:
            t = min(t, 0.01)
        return t

    def _drain_mailbox(self) -> None:
        while True:
            with self._mailbox_lock:
                if not self._mailbox:
                    return
                action = self._mailbox.popleft()
            action()

    def _outputs_available(self) -> bool:
        return all(w.is_available() for w in self.all_writers)

    def _fire_timers(self) -> None:
        now = time.time()
        if now - self._timer_check < 0.005:
            return
        self._timer_check = now
        ms = int(now * 1000)
        for op in self.operators:
            nxt = op.next_timer_ms()
            if nxt is not None and nxt <= ms:
                op.on_processing_time(ms)
        self.handler.check_timeout()

    def _split(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        n = self.max_batch_rows
        if n <= 0 or batch.num_rows <= n:
            return [batch]
        return [batch.slice(i, n) for i in range(0, batch.num_rows, n)]

    # -- sources -------------------------------------------------------------------------------------
    def emit(self, batch: pa.RecordBatch) -> None:
        """ReaderOutput: a batch read by the source reader."""
        for part in self._split(batch):
            self._fault("source")
            self.operators[0].process_batch(part, 0)

    def emit_side(self, tag: str, batch: pa.RecordBatch) -> None:
        self.operators[0].output.emit_side(tag, batch)

    def mark_idle(self) -> None:
        """ReaderOutput: the reader is idle; downstream leaves it out of the watermark minimum."""
        if not self._idle:
            self._idle = True
            for w in self.all_writers:
                w.broadcast(WatermarkStatus(idle=True))

    def emit_watermark(self, timestamp_ms: int) -> None:
        self._idle = False
        if timestamp_ms > self._watermark:
            self._watermark = timestamp_ms
            self.operators[0].process_watermark(timestamp_ms)

    def _poll_source(self) -> bool:
        assert self.reader is not None
        status = self.reader.poll_next(self)
        if status is InputStatus.END_OF_INPUT:
            self._end_input()
            return True
        if status is InputStatus.NOTHING_AVAILABLE:
            self.signal.wait(0.005)
        return status is InputStatus.MORE_AVAILABLE

    # -- inputs --------------------------------------------------------------------------------------
    def _poll_input(self, events_only: bool = False) -> bool:
        n = len(self.inputs)
        for k in range(n):
            i = (self._rr + k) % n
            if i in self._blocked or i in self._ended:
                continue
            ch = self.inputs[i]
            if not ch.has_input():
                continue
            if events_only and not ch.head_is_event():
                continue
            item = ch.poll()
            if item is None:
                continue
            self._rr = i + 1
            self._handle(i, item)
            return True
        return False

    def _handle(self, channel: int, item: Any) -> None:
        if isinstance(item, pa.RecordBatch):
            rec = self._recording
            if rec is not None and channel in rec.recording:
                rec.input_state.append((channel, item))
            self._fault("process")
            for part in self._split(item):
                self.operators[0].process_batch(part, self.edge_of[channel])
        elif isinstance(item, Watermark):
            self._channel_wm[channel] = item.timestamp
            self._idle_channels.discard(channel)
            self._advance_watermark()
        elif isinstance(item, WatermarkStatus):
            if item.idle:
                self._idle_channels.add(channel)
            else:
                self._idle_channels.discard(channel)
            self._advance_watermark()
        elif isinstance(item, CheckpointBarrier):
            overtaken = self.inputs[channel].take_overtaken() if item.options.is_unaligned else None
            if len(self.handler.live - self.handler.received) > 1:
                self._fault("align")
            self.handler.on_barrier(channel, item, overtaken)
        elif isinstance(item, CheckpointAnnouncement):
            self.handler.on_announcement(channel, item.barrier)
        elif isinstance(item, CancelCheckpointMarker):
            self.handler.on_cancel(channel, item.checkpoint_id)
        elif isinstance(item, EndOfPartition):
            self._ended.add(channel)
            self._blocked.discard(channel)
            self.handler.on_end_of_partition(channel)
            self._advance_watermark()
            if len(self._ended) == len(self.inputs):
                self._end_input()

    def _advance_watermark(self) -> None:
        live = [
            wm
            for i, wm in enumerate(self._channel_wm)
            if i not in self._ended and i not in self._idle_channels
        ]
        wm = min(live) if live else self._watermark
        if wm > self._watermark:
            self._watermark = wm
            self.operators[0].process_watermark(wm)

    def _end_input(self) -> None:
        if self.status is not TaskStatus.RUNNING:
            return
        for op in self.operators:
            op.end_input()
        for w in self.all_writers:
            w.broadcast(EndOfPartition())
        self.status = TaskStatus.WAITING_FOR_FINAL
        self.gateway.end_of_input(self.id)

    # -- BarrierTarget ---------------------------------------------------------------------------------
    def block(self, channel: int) -> None:
        self._blocked.add(channel)

    def unblock_all(self) -> None:
        self._blocked.clear()

    def alignment_done(self, checkpoint_id: int, alignment_s: float, switched: bool) -> None:
        p = self._pending.get(checkpoint_id)
        if p is not None:
            p.alignment_s = alignment_s
            p.switched = switched

    def abort_checkpoint(self, checkpoint_id: int, reason: str) -> None:
        for w in self.all_writers:
            w.broadcast(CancelCheckpointMarker(checkpoint_id))
        if self._recording is not None and self._recording.barrier.checkpoint_id == checkpoint_id:
            self._recording = None
        self._pending.pop(checkpoint_id, None)
        self.gateway.decline(self.id, checkpoint_id, f"{self.name}: {reason}")

    def pull_barrier_forward(self, channel: int, checkpoint_id: int) -> list[pa.RecordBatch] | None:
        return self.inputs[channel].find_barrier(checkpoint_id)

    def start_recording(
        self, checkpoint_id: int, channels: set[int], overtaken: dict[int, list[Any]]
    ) -> None:
        p = self._pending[checkpoint_id]
        for ch, batches in overtaken.items():
            p.input_state.extend((ch, b) for b in batches)
        p.recording = set(channels)
        self._recording = p

    def add_overtaken(self, checkpoint_id: int, channel: int, batches: list[Any]) -> None:
        p = self._pending.get(checkpoint_id)
        if p is not None:
            p.input_state.extend((channel, b) for b in batches)

    def stop_recording(self, channel: int) -> None:
        if self._recording is not None:
            self._recording.recording.discard(channel)

    def finish_recording(self, checkpoint_id: int) -> None:
        p = self._pending.get(checkpoint_id)
        self._recording = None
        if p is not None:
            self._fault("channel_state")
            self._upload(p)

    def perform_checkpoint(
        self, barrier: CheckpointBarrier, unaligned: bool, upload_now: bool = False
    ) -> None:
        cid = barrier.checkpoint_id
        self._last_triggered = max(self._last_triggered, cid)
        t0 = time.perf_counter()
        for op in self.operators:
            op.prepare_snapshot_pre_barrier(cid)
        snaps = {op.name: op.snapshot_state(cid) for op in self.operators}
        splits = self.reader.snapshot_state(cid) if self.reader is not None else None
        output_state: list[tuple[int, pa.RecordBatch]] = []
        announce = barrier.options.alignment is AlignmentMode.ADAPTIVE and not unaligned
        # after end of input the outputs carry EndOfPartition: no barrier follows it, and what is still
        # queued before it belongs to the receivers' checkpoints (they see the channel as live until they
        # reach EndOfPartition), so this task persists no output state
        writers = self.all_writers if self.status is TaskStatus.RUNNING else []
        for idx, w in enumerate(writers):
            if unaligned and w.partitioner.supports_unaligned:
                output_state.extend((idx, b) for b in w.broadcast_priority(barrier))
            else:
                if announce and w.partitioner.supports_unaligned:
                    w.broadcast_priority(CheckpointAnnouncement(barrier))
                w.broadcast(
                    barrier if w.partitioner.supports_unaligned or not unaligned else _aligned(barrier)
                )
        sync_s = time.perf_counter() - t0
        p = _PendingSnapshot(barrier, snaps, splits, t0, sync_s, unaligned, output_state=output_state)
        self._pending[cid] = p
        if self.status is TaskStatus.WAITING_FOR_FINAL and self._final_after is None:
            self._final_after = cid
        if not unaligned or upload_now:
            self._upload(p)

    def _on_trigger(self, barrier: CheckpointBarrier) -> None:
        if barrier.checkpoint_id <= self._last_triggered or barrier.checkpoint_id <= self.handler.last_done:
            return  # already handled through the channels
        if self.reader is None and self.status is TaskStatus.RUNNING:
            return  # barriers reach this task through its inputs
        self.handler.last_done = barrier.checkpoint_id
        # a source (or a task whose inputs all ended) has no input to record: unaligned only means its
        # barrier overtakes its own output queue
        self.perform_checkpoint(barrier, barrier.options.is_unaligned, upload_now=True)
        self.alignment_done(barrier.checkpoint_id, 0.0, False)

    def _upload(self, p: _PendingSnapshot) -> None:
        """Hand the frozen snapshot to the upload thread (the asynchronous part)."""
        self._uploads.submit(self._upload_async, p)

    def _upload_async(self, p: _PendingSnapshot) -> None:
        cid = p.barrier.checkpoint_id
        try:
            t0 = time.perf_counter()
            ops: dict[str, Any] = {}
            committables: list[Any] = []
            for name, s in p.operators.items():
                if s.async_part is not None:
                    s.async_part(s)
                ops[name] = {
                    "keyed": s.keyed.serialize() if s.keyed is not None else {},
                    "operator": s.operator,
                }
                if s.committables:
                    committables.extend((name, c) for c in s.committables)
            payload = {
                "operators": ops,
                "splits": p.splits,
                "input_state": [(self.edge_of[ch], _ipc(b)) for ch, b in p.input_state],
                "output_state": [(idx, _ipc(b)) for idx, b in p.output_state],
            }
            data = encode_task_state(payload)
            savepoint = p.barrier.options.kind.value == "savepoint"
            path = self.storage.write_task_state(
                cid, f"{self.id.vertex}-{self.id.index}.state", data, savepoint
            )
            self._fault("snapshot_to_ack")
            inflight = sum(b.nbytes for _, b in p.input_state) + sum(b.nbytes for _, b in p.output_state)
            handle = {
                "path": path,
                "size": len(data),
                "committables": committables,
                "stats": {
                    "sync_s": p.sync_s,
                    "async_s": time.perf_counter() - t0,
                    "alignment_s": p.alignment_s,
                    "unaligned": p.unaligned,
                    "switched": p.switched,
                    "inflight_bytes": inflight,
                    "state_bytes": len(data),
                },
            }
            self.gateway.acknowledge(self.id, cid, handle)
        except Exception as exc:
            log.warning("%s: checkpoint %d upload failed: %s", self.name, cid, exc)
            self.gateway.decline(self.id, cid, f"{self.name}: upload failed: {exc}")
        except BaseException as exc:  # a crash (simulated ones too): the task fails, as its process would
            self._async_error = exc
            self.signal.notify()

    def _on_complete(self, checkpoint_id: int) -> None:
        for cid in [c for c in self._pending if c <= checkpoint_id]:
            del self._pending[cid]
        for op in self.operators:
            op.notify_checkpoint_complete(checkpoint_id)
        if self.reader is not None:
            self.reader.notify_checkpoint_complete(checkpoint_id)
        if self.status is TaskStatus.WAITING_FOR_FINAL and self._final_after is not None:
            if checkpoint_id >= self._final_after:
                self._fault("final_checkpoint")
                self.status = TaskStatus.FINISHED
                self.gateway.finished(self.id)

    def _on_aborted(self, checkpoint_id: int) -> None:
        self.handler.on_aborted(checkpoint_id)
        if self._pending.pop(checkpoint_id, None) is not None:
            if self._recording is not None and self._recording.barrier.checkpoint_id == checkpoint_id:
                self._recording = None
        if self._final_after == checkpoint_id:
            self._final_after = None
        for op in self.operators:
            op.notify_checkpoint_aborted(checkpoint_id)

    def _close(self, quiet: bool = False) -> None:
        for op in self.operators:
            try:
                op.close()
            except Exception:
                if not quiet:
                    raise
        if self.reader is not None:
            try:
                self.reader.close()
            except Exception:
                if not quiet:
                    raise


class _Cancelled(Exception):
    pass


def _aligned(barrier: CheckpointBarrier) -> CheckpointBarrier:
    """The in-order version of ``barrier`` for exchanges that are never unaligned (forward, broadcast)."""
    from sluice.events import CheckpointOptions

    opts = CheckpointOptions(barrier.options.kind, AlignmentMode.ALIGNED, barrier.options.alignment_timeout)
    return CheckpointBarrier(barrier.checkpoint_id, barrier.timestamp, opts)


def _ipc(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    data: bytes = sink.getvalue().to_pybytes()
    return data


def read_ipc(data: bytes) -> pa.RecordBatch:
    """Inverse of the channel-state serialization."""
    return pa.ipc.open_stream(data).read_next_batch()
