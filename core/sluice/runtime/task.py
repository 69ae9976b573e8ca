"""A task: one subtask of a job vertex, running its operator chain in one thread with a mailbox.

Operators are touched only on the task thread; the one other thread uploads checkpoints' frozen snapshots,
acknowledges, and ends before the operators close (Flink's ``AsyncCheckpointRunnable``s: ``checkpointing.stop``).

The task (Flink ``StreamTask`` with its ``MailboxProcessor``) keeps the mailbox loop and the task's
lifecycle, and wires the roles of the protocol:

* :class:`~sluice.runtime.input_gate.InputGate` - polling the inputs, alignment blocking, event dispatch;
* :class:`~sluice.runtime.watermarks.StatusWatermarkValve` - the task's event time;
* :mod:`sluice.runtime.output` - record writers, chain outputs, the source reader's output;
* :func:`~sluice.checkpoint.barriers.barrier_handler` - when to snapshot, per checkpoint mode; the handler
  acts on the input gate (block, unblock, pull a barrier forward) and on the subtask's checkpointing;
* :class:`~sluice.checkpoint.subtask.SubtaskCheckpointing` - snapshots, uploads, acks, channel state;
* :class:`~sluice.runtime.finishing.TaskFinishing` - end of input, the final checkpoint, the task's status.

Barriers go one way: input gate -> barrier handler -> input gate / subtask checkpointing.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import pyarrow as pa

from sluice.checkpoint.barriers import barrier_handler
from sluice.checkpoint.storage import CheckpointStorage
from sluice.checkpoint.subtask import CheckpointResponder, SubtaskCheckpointing
from sluice.events import AlignmentMode, CheckpointBarrier
from sluice.graph import SubtaskId
from sluice.operators.base import MAX_WATERMARK
from sluice.runtime.fault_hook import NO_FAULTS, FaultHook
from sluice.runtime.finishing import TaskFinishing, TaskStatus
from sluice.runtime.input_gate import InputGate
from sluice.runtime.memory import start_trimmer
from sluice.runtime.output import ChainOutput, SourceOutput, split_rows
from sluice.runtime.task_metrics import TaskMetrics
from sluice.runtime.task_spec import TaskSpec
from sluice.runtime.watermarks import StatusWatermarkValve
from sluice.source import InputStatus, SourceSplit

__all__ = ["Task", "TaskGateway", "TaskStatus"]


class TaskGateway(CheckpointResponder, Protocol):
    """How a task talks to the coordinator (a method call in-process, a TCP message on Spark)."""

    def end_of_input(self, task: SubtaskId) -> None: ...
    def finished(self, task: SubtaskId) -> None: ...
    def failed(self, task: SubtaskId, error: BaseException) -> None: ...
    def request_split(self, task: SubtaskId) -> None: ...


class Task:
    """Runs one subtask. Create, then :meth:`start`; the coordinator drives it through the public methods.

    Args:
        spec: The assembled subtask (see :func:`sluice.runtime.assembly.build_task`).
        gateway: Where the task reports to the coordinator.
        storage: Where its checkpoints' state goes.
        faults: Fault injection (tests); a no-op by default.
    """

    def __init__(
        self,
        spec: TaskSpec,
        gateway: TaskGateway,
        storage: CheckpointStorage,
        faults: FaultHook = NO_FAULTS,
    ) -> None:
        self.spec = spec
        self.id = spec.task_id
        self.name = spec.subtask_name
        self.operators = spec.operators
        self.contexts = spec.contexts
        self.reader = spec.reader
        self.all_writers = spec.all_writers
        self.alignment = spec.alignment
        self.signal = spec.signal
        self.gateway = gateway
        self.faults = faults
        self._mailbox: deque[Callable[[], None]] = deque()
        self._mailbox_lock = threading.Lock()
        self._cancelled = False
        self.finishing = TaskFinishing(
            self.all_writers, any(op.emits_at_checkpoint for op in spec.operators), self._fault
        )
        self._thread: threading.Thread | None = None
        self._discarded = False  #: closed without having started
        self._timer_check = 0.0
        #: built-in metrics (None if the job runs without: ``JobConfig.metrics``)
        self.io = TaskMetrics() if spec.metrics else None
        self._head = spec.operators[0]
        self._input_index_of = spec.input_index_of
        self._max_rows = spec.max_batch_rows
        self.checkpointing = SubtaskCheckpointing(spec, gateway, storage, self.finishing, self._fault)
        self._channel_state = self.checkpointing.channel_state
        timeouts = self._head.input_idle_timeouts
        self.valve = StatusWatermarkValve(
            len(spec.inputs),
            self._head.process_watermark,
            [timeouts.get(i) for i in spec.input_index_of] if timeouts else None,
        )
        self._idle_timeouts = self.valve.has_idle_timeouts
        self.gate = InputGate(
            spec.inputs,
            lambda gate: barrier_handler(spec.alignment, len(spec.inputs), gate, self.checkpointing),
            self.valve,
            self._process_input,
            self._end_input,
            self._fault,
        )
        self.handler = self.gate.handler
        if spec.restore is not None and spec.restore.recovers_channel_state and spec.inputs:
            self.gate.expect_recovered_data()
        self._source_output = SourceOutput(
            self._head, self.all_writers, self.valve, spec.max_batch_rows, self._fault, self.io
        )
        for ctx in spec.contexts:
            ctx.fault_hook = self._fault
        self._keyed_backends = [be for ctx in spec.contexts for be in ctx.keyed_backends]

    @property
    def status(self) -> TaskStatus:
        return self.finishing.status

    # -- called from other threads (coordinator, transport) ------------------------------------------
    def post(self, action: Callable[[], None]) -> None:
        """Run ``action`` on the task thread, between two items of input."""
        with self._mailbox_lock:
            self._mailbox.append(action)
        self.signal.notify()

    def trigger_checkpoint(self, barrier: CheckpointBarrier) -> None:
        """Coordinator: take checkpoint ``barrier`` now (sources, and tasks whose inputs all ended)."""
        self.post(lambda: self._on_trigger(barrier))

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Coordinator: ``checkpoint_id`` completed."""
        self.post(lambda: self._on_complete(checkpoint_id))

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Coordinator: ``checkpoint_id`` was aborted."""
        self.post(lambda: self._on_aborted(checkpoint_id))

    def assign_splits(self, splits: list[SourceSplit]) -> None:
        """Coordinator: hand ``splits`` to this source task's reader."""
        assert self.reader is not None
        reader = self.reader
        self.post(lambda: reader.add_splits(splits))

    def no_more_splits(self) -> None:
        """Coordinator: this source task's reader gets no more splits."""
        assert self.reader is not None
        self.post(self.reader.notify_no_more_splits)

    def cancel(self) -> None:
        """Stop the task thread at the next turn of its loop, without reporting a failure. A task that never
        started (its attempt failed first) closes its operators at once: their keyed state backends (an open
        RocksDB and its folder) are released in this process, not when it ends."""
        self._cancelled = True
        self.signal.notify()
        if self._thread is None and not self._discarded:
            self._discarded = True
            self.spec.close(quiet=True)

    def start(self) -> None:
        """Start the task thread (and, once per process, the thread that trims malloc's free memory)."""
        start_trimmer()
        self._thread = threading.Thread(target=self._run, name=f"task-{self.id}", daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds (None: for ever) for the task thread and its upload thread to
        end; True if both did."""
        deadline = time.monotonic() + (1e9 if timeout is None else timeout)
        if self._thread is not None:
            self._thread.join(timeout)
        alive = self._thread is not None and self._thread.is_alive()
        return not alive and self.checkpointing.uploads.join(max(0.0, deadline - time.monotonic()))

    def alive_threads(self) -> list[str]:
        """The names of this task's threads still running (the task thread, its upload thread)."""
        names = [self._thread.name] if self._thread is not None and self._thread.is_alive() else []
        return names + self.checkpointing.uploads.alive()

    def metrics_snapshot(self) -> dict[str, Any] | None:
        """The task's built-in metrics and its operators' counters and gauges now (any thread), or None
        if the job runs without metrics (see :mod:`sluice.runtime.task_metrics`)."""
        if self.io is None:
            return None
        outputs = [op.output for op in self.operators if isinstance(op.output, ChainOutput)]
        return self.io.snapshot(self.all_writers, outputs, self.contexts, self.valve.watermark)

    def describe(self) -> str:
        """One line of diagnostics: status, alignment, queues (for logs and hung-job reports)."""
        outq = [ch.queued_output() for w in self.all_writers for ch in w.channels]
        h = self.handler
        return (
            f"{self.name}: {self.status.value} handler={h.state_name} "
            f"current={h.current.checkpoint_id if h.current else None} last_done={h.last_done} "
            f"blocked={sorted(self.gate.blocked)} ended={sorted(self.gate.ended)} held={sorted(self.gate.held)} "
            f"in={self.gate.queued()} out={outq} final_after={self.finishing.final_after} "
            f"pending={self.checkpointing.pending}"
        )

    # -- the task thread -----------------------------------------------------------------------------
    def _fault(self, point: str) -> None:
        self.faults.hit(point, self.name)

    def _run(self) -> None:
        try:
            self._initialize()
            self._loop()
            # the running upload reads state the operators dispose of when they close: it ends first (it is
            # cancelled at its next step: the coordinator uses the finished task's final state from now on)
            self.checkpointing.stop(cancel=True, timeout=self.spec.stop_timeout)
            self.spec.close()
        except _Cancelled:
            self._stop_quietly()
        except BaseException as exc:
            self._stop_quietly()
            if not self._cancelled:
                self.gateway.failed(self.id, exc)
        finally:
            if self.io is not None:
                self.io.ended = time.monotonic()

    def _stop_quietly(self) -> None:  # a failed or cancelled task: uploads cancelled, then operators closed
        try:
            self.checkpointing.stop(cancel=True, timeout=self.spec.stop_timeout)
        finally:
            self.spec.close(quiet=True)

    def _initialize(self) -> None:
        r = self.spec.restore
        if r is not None:
            self._fault("restore")
        for op in self.operators:
            keyed = r.keyed.get(op.name, []) if r else []
            states = r.operator.get(op.name, []) if r else []
            t0 = time.perf_counter()
            op.initialize_state(keyed, states)
            if keyed:  # how long restoring the operator's keyed state took (local copy or checkpoint storage)
                op.ctx.gauge("state_restore_s", time.perf_counter() - t0)
        for op in self.operators:
            op.open()
        if self.reader is not None:
            self.reader.start()
        if r is not None:
            r.recover_channel_state(self.all_writers, self.operators)

    def _loop(self) -> None:
        while True:
            self._drain_mailbox()
            if self._cancelled:
                raise _Cancelled
            if self.checkpointing.async_error is not None:
                raise self.checkpointing.async_error
            if self.status is TaskStatus.FINISHED:
                return
            self._fire_timers()
            progressed = False
            backpressured = self.status is TaskStatus.RUNNING and not self._outputs_available()
            if self.status is TaskStatus.RUNNING and not backpressured:
                if self.reader is None:
                    progressed = self.gate.poll()
                elif self.finishing.terminate_at is None:  # a stopping source reads nothing after its last barrier
                    progressed = self._poll_source()
            elif self.status is TaskStatus.RUNNING and self.reader is None and self.handler.in_progress:
                # backpressured, but barriers and events must still be seen
                progressed = self.gate.poll(events_only=True)
            if not progressed:
                self._wait(backpressured)

    def _wait(self, backpressured: bool) -> None:
        io = self.io
        if io is None:
            self.signal.wait(self._wait_timeout())
            return
        t0 = time.monotonic()
        self.signal.wait(self._wait_timeout())
        if backpressured:
            io.backpressured_s += time.monotonic() - t0
        else:
            io.idle_s += time.monotonic() - t0

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
        if self._idle_timeouts:
            self.valve.check_idle()
        if self.status is TaskStatus.RUNNING:  # changelog state: a materialization once its interval passed
            for be in self._keyed_backends:
                be.materialize_if_due()

    def _poll_source(self) -> bool:
        assert self.reader is not None
        t0 = time.monotonic() if self.io is not None else 0.0
        status = self.reader.poll_next(self._source_output)
        if status is InputStatus.END_OF_INPUT:
            if self.status is TaskStatus.RUNNING:  # bounded input: event time runs to its end (as Flink)
                self._source_output.emit_watermark(MAX_WATERMARK)
            self._end_input()
            return True
        if status is InputStatus.NOTHING_AVAILABLE:
            self.signal.wait(0.005)
            if self.io is not None:  # the reader waited for data: idle, not busy
                self.io.idle_s += time.monotonic() - t0
        return status is InputStatus.MORE_AVAILABLE

    def _process_input(self, channel: int, batch: pa.RecordBatch) -> None:
        """A data batch from input ``channel`` (the gate's output)."""
        if self._channel_state.recording:
            self._channel_state.record(channel, batch)
        if self._idle_timeouts:
            self.valve.input_data(channel)
        if self.io is not None:
            self.io.count_in(batch.num_rows, batch.get_total_buffer_size())
        self._fault("process")
        for part in split_rows(batch, self._max_rows):
            self._head.process_batch(part, self._input_index_of[channel])

    def _end_input(self) -> None:
        if self.status is not TaskStatus.RUNNING:
            return
        for op in self.operators:
            op.end_input()
        self.finishing.input_ended()
        self.gateway.end_of_input(self.id)

    # -- mailbox actions -----------------------------------------------------------------------------
    def _on_trigger(self, barrier: CheckpointBarrier) -> None:
        cid = barrier.checkpoint_id
        if cid <= self.checkpointing.last_triggered or cid <= self.handler.last_done:
            return  # already handled through the channels
        if self.status is TaskStatus.FINISHED or (self.reader is None and self.status is TaskStatus.RUNNING):
            return  # finished: its final state stands in for it; running: barriers come through its inputs
        self.handler.last_done = cid
        if barrier.options.drain and self.reader is not None and self.status is TaskStatus.RUNNING:
            # stop-with-savepoint --drain: event time to its end (timers fire), then end of input
            self._source_output.emit_watermark(MAX_WATERMARK)
            self._end_input()
        # a source (or a task whose inputs all ended) has no input to record: unaligned only means its
        # barrier overtakes its own output queue
        self.checkpointing.perform_checkpoint(barrier, barrier.options.is_unaligned, upload_now=True)
        self.checkpointing.alignment_done(cid, 0.0, False)

    def _on_complete(self, checkpoint_id: int) -> None:
        self.checkpointing.notify_complete(checkpoint_id)
        if self.finishing.checkpoint_complete(checkpoint_id):
            self.gateway.finished(self.id)

    def _on_aborted(self, checkpoint_id: int) -> None:
        self.handler.on_aborted(checkpoint_id)
        self.finishing.checkpoint_aborted(checkpoint_id)
        self.checkpointing.notify_aborted(checkpoint_id)


class _Cancelled(Exception):
    pass
