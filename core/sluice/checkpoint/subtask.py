"""A subtask's part of a checkpoint (Flink ``SubtaskCheckpointCoordinatorImpl``).

The **synchronous part** runs on the task thread when the barrier handler decides (or the coordinator
triggers a source): every operator flushes what it buffers (pre-barrier), then snapshots its state as a
cheap frozen copy, the source reader snapshots its split positions, and the barrier goes to every output:
in order, at the head of the output queues when unaligned (the overtaken output becomes channel state), or
in order after a priority *announcement* in timeout-adaptive mode. Exchanges that are never unaligned
(forward, broadcast) get the in-order version of an unaligned barrier.

The **asynchronous part** runs on the task's upload thread, so the task keeps processing: operators'
asynchronous work (e.g. sink compaction), serialization, the write to checkpoint storage, then the
acknowledgement with the state handle and the checkpoint's stats. An unaligned checkpoint is uploaded only
once its channel state is complete. An upload that fails declines the checkpoint; a crash there (a
``BaseException``) fails the task, as it would fail its process.

**Stopping** (:meth:`SubtaskCheckpointing.stop`, before the task closes its operators, whose state backends
the uploads read): uploads not started are dropped and the running one is cancelled at its next step, then
waited for (:mod:`sluice.checkpoint.uploads`). A finished task loses nothing by that: the coordinator uses
its final state for every later checkpoint.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa

from sluice.checkpoint.channel_state import ChannelState, ChannelStateRecorder
from sluice.checkpoint.payload import encode_task_state
from sluice.checkpoint.snapshot import OperatorSnapshot
from sluice.checkpoint.state_files import ack_shared, keyed_sizes
from sluice.checkpoint.storage import CheckpointStorage
from sluice.checkpoint.uploads import AsyncUploads, UploadCancelled
from sluice.errors import CheckpointFailureReason
from sluice.events import (
    AlignmentMode,
    CancelCheckpointMarker,
    CheckpointAnnouncement,
    CheckpointBarrier,
    CheckpointKind,
)
from sluice.graph import SubtaskId
from sluice.source import SourceReader, SourceSplit

__all__ = [
    "BarrierWriter",
    "CheckpointResponder",
    "CheckpointedSubtask",
    "EndOfInputOutputs",
    "PendingSnapshot",
    "SnapshotOperator",
    "SubtaskCheckpointing",
]

log = logging.getLogger("sluice.task")


class CheckpointResponder(Protocol):
    """Where a subtask reports the outcome of its part of a checkpoint (the coordinator)."""

    def acknowledge(self, task: SubtaskId, checkpoint_id: int, handle: dict[str, Any]) -> None: ...
    def decline(
        self,
        task: SubtaskId,
        checkpoint_id: int,
        reason: str,
        failure: CheckpointFailureReason = CheckpointFailureReason.DECLINED,
    ) -> None: ...


class SnapshotOperator(Protocol):
    """What checkpointing asks of an operator of the chain."""

    @property
    def name(self) -> str:
        """The operator's uid: it keys the operator's state."""

    def prepare_snapshot_pre_barrier(self, checkpoint_id: int) -> None: ...
    def snapshot_state(self, checkpoint_id: int, savepoint: bool = False) -> OperatorSnapshot: ...
    def notify_checkpoint_complete(self, checkpoint_id: int) -> None: ...
    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None: ...


class BarrierWriter(Protocol):
    """What checkpointing asks of an output writer: send events to every channel, in order or ahead."""

    @property
    def supports_unaligned(self) -> bool:
        """Its exchange lets a barrier overtake data (not forward, not broadcast)."""

    def broadcast(self, event: Any) -> None: ...
    def broadcast_priority(self, event: Any) -> list[pa.RecordBatch]:
        """Send ``event`` ahead of queued output; returns the output it overtook."""


class _Wakeup(Protocol):
    def notify(self) -> None: ...


class CheckpointedSubtask(Protocol):
    """What checkpointing needs of its subtask: operators, reader, writers and how state is written."""

    @property
    def task_id(self) -> SubtaskId: ...
    @property
    def subtask_name(self) -> str: ...
    @property
    def operators(self) -> Sequence[SnapshotOperator]: ...
    @property
    def reader(self) -> SourceReader | None: ...
    @property
    def all_writers(self) -> Sequence[BarrierWriter]:
        """Every output writer, in the order output channel state numbers them."""

    @property
    def input_index_of(self) -> list[int]:
        """For each input channel, the head operator's input it feeds."""

    @property
    def checkpoint_key(self) -> bytes: ...
    @property
    def signal(self) -> _Wakeup:
        """Wakes the task thread (to re-raise a crash of the upload thread)."""

    def pack_splits(self, splits: list[SourceSplit] | None) -> list[Any] | None:
        """The reader's snapshot as the task state stores it."""


class EndOfInputOutputs(Protocol):
    """What the task's end of input means for its snapshots (its final checkpoint)."""

    def outputs_open(self) -> bool:
        """False once the outputs carry ``EndOfPartition``: no barrier follows it. What is still queued
        before it belongs to the receivers' checkpoints (they see the channel as live until they reach
        ``EndOfPartition``), so no output state either."""

    def snapshot_taken(self, barrier: CheckpointBarrier) -> None:
        """The snapshot of ``barrier`` was taken and the barrier forwarded."""


@dataclass
class PendingSnapshot:
    """A checkpoint between its synchronous snapshot and its acknowledgement."""

    barrier: CheckpointBarrier
    operators: dict[str, OperatorSnapshot]
    splits: list[SourceSplit] | None
    started: float
    sync_s: float
    unaligned: bool
    channel_state: ChannelState = field(default_factory=ChannelState)
    alignment_s: float = 0.0
    switched: bool = False
    #: handed to the upload thread (its keyed snapshots run there, or are dropped with the thread)
    submitted: bool = False


class SubtaskCheckpointing:
    """Takes, uploads, acknowledges and forgets the snapshots of one subtask.

    Every method except the upload itself runs on the task thread.

    Args:
        spec: The subtask (its operators, reader, writers and input numbering).
        responder: Receives acknowledgements and declines.
        storage: Where the task's state file of each checkpoint goes.
        outputs: Whether the outputs still take a barrier, told of every snapshot (the task's end of input).
        fault: The task's fault-injection hook.
    """

    def __init__(
        self,
        spec: CheckpointedSubtask,
        responder: CheckpointResponder,
        storage: CheckpointStorage,
        outputs: EndOfInputOutputs,
        fault: Callable[[str], None],
    ) -> None:
        self._spec = spec
        self._name = spec.subtask_name
        self._responder = responder
        self._storage = storage
        self._outputs = outputs
        self._fault = fault
        self._pending: dict[int, PendingSnapshot] = {}
        #: the thread of the asynchronous parts
        self.uploads: AsyncUploads[PendingSnapshot] = AsyncUploads(f"upload-{spec.task_id}", self._upload_async, _discard)
        #: the channel state of the unaligned checkpoint collecting its barriers, if any
        self.channel_state = ChannelStateRecorder()
        #: the highest checkpoint this subtask snapshotted
        self.last_triggered = 0
        #: a crash of the upload thread, re-raised by the task thread
        self.async_error: BaseException | None = None

    @property
    def pending(self) -> list[int]:
        """Ids of the checkpoints snapshotted but not yet completed or aborted."""
        return sorted(self._pending)

    # -- the synchronous part ------------------------------------------------------------------------
    def perform_checkpoint(self, barrier: CheckpointBarrier, unaligned: bool, upload_now: bool = False) -> None:
        """Snapshot operators and reader, forward ``barrier`` (unless the outputs ended), and upload unless
        channel state is due.

        Args:
            barrier: The checkpoint's barrier.
            unaligned: Send the barrier ahead of queued output and persist what it overtook.
            upload_now: Upload at once even if unaligned (a task without inputs records nothing).
        """
        cid = barrier.checkpoint_id
        self.last_triggered = max(self.last_triggered, cid)
        t0 = time.perf_counter()
        for op in self._spec.operators:
            op.prepare_snapshot_pre_barrier(cid)
        savepoint = barrier.options.kind is CheckpointKind.SAVEPOINT
        snaps = {op.name: op.snapshot_state(cid, savepoint=savepoint) for op in self._spec.operators}
        reader = self._spec.reader
        splits = reader.snapshot_state(cid) if reader is not None else None
        state = ChannelState()
        announce = barrier.options.alignment is AlignmentMode.ADAPTIVE and not unaligned
        writers = self._spec.all_writers if self._outputs.outputs_open() else []
        for idx, w in enumerate(writers):
            if unaligned and w.supports_unaligned:
                state.output.extend((idx, b) for b in w.broadcast_priority(barrier))
            else:
                if announce and w.supports_unaligned:
                    w.broadcast_priority(CheckpointAnnouncement(barrier))
                w.broadcast(
                    barrier if w.supports_unaligned or not unaligned else _aligned(barrier)
                )
        sync_s = time.perf_counter() - t0
        p = PendingSnapshot(barrier, snaps, splits, t0, sync_s, unaligned, channel_state=state)
        self._pending[cid] = p
        self._outputs.snapshot_taken(barrier)  # before the upload: whether this is the final snapshot is known
        if not unaligned or upload_now:
            self._upload(p)

    def alignment_done(self, checkpoint_id: int, alignment_s: float, switched: bool) -> None:
        """Record how long the checkpoint aligned, and whether it switched to unaligned on the way."""
        p = self._pending.get(checkpoint_id)
        if p is not None:
            p.alignment_s = alignment_s
            p.switched = switched

    # -- channel state -------------------------------------------------------------------------------
    def start_recording(
        self, checkpoint_id: int, channels: set[int], overtaken: dict[int, list[Any]]
    ) -> None:
        """Persist the input each barrier overtook, and record ``channels`` until their barrier."""
        self.channel_state.start(
            checkpoint_id, self._pending[checkpoint_id].channel_state, channels, overtaken
        )

    def stop_recording(self, channel: int) -> None:
        """``channel`` delivered its barrier (or ended): what follows belongs to the next checkpoint."""
        self.channel_state.stop(channel)

    def add_overtaken(self, checkpoint_id: int, channel: int, batches: list[Any]) -> None:
        """Persist input that a later channel's priority barrier overtook."""
        p = self._pending.get(checkpoint_id)
        if p is not None:
            p.channel_state.input.extend((channel, b) for b in batches)

    def finish_recording(self, checkpoint_id: int) -> None:
        """The channel state is complete: upload the checkpoint."""
        p = self._pending.get(checkpoint_id)
        self.channel_state.finish()
        if p is not None:
            self._fault("channel_state")
            self._upload(p)

    # -- the asynchronous part -----------------------------------------------------------------------
    def _upload(self, p: PendingSnapshot) -> None:
        p.submitted = True
        self.uploads.submit(p)

    def _drop(self, checkpoint_id: int) -> PendingSnapshot | None:
        """Forget a pending checkpoint; keyed snapshots never handed to the upload thread release their
        local resources (a RocksDB checkpoint folder)."""
        p = self._pending.pop(checkpoint_id, None)
        if p is not None and not p.submitted:
            _discard(p)
        return p

    def _upload_async(self, p: PendingSnapshot) -> None:
        cid = p.barrier.checkpoint_id
        task_id = self._spec.task_id
        try:
            t0 = time.perf_counter()
            ops: dict[str, Any] = {}
            committables: list[Any] = []
            keyed: list[dict[str, Any]] = []
            check = self.uploads.check  # a cancelled upload stops between steps
            for name, s in p.operators.items():
                check()
                if s.async_part is not None:
                    s.async_part(s)
                check()
                handle = s.keyed.run() if s.keyed is not None else None  # writes or uploads keyed state
                s.keyed = None  # ran: nothing left to discard
                if handle is not None:
                    keyed.append(handle)
                ops[name] = {"keyed": handle, "operator": s.operator}
                if s.committables:
                    committables.extend((name, c) for c in s.committables)
            payload: dict[str, Any] = {"operators": ops, "splits": self._spec.pack_splits(p.splits)}
            payload.update(p.channel_state.encode(self._spec.input_index_of))
            data = encode_task_state(payload, self._spec.checkpoint_key)
            savepoint = p.barrier.options.kind is CheckpointKind.SAVEPOINT
            check()
            path = self._storage.write_task_state(
                cid, f"{task_id.vertex}-{task_id.index}.state", data, savepoint
            )
            self._fault("snapshot_to_ack")
            handle = {
                "path": path,
                "size": len(data),
                "committables": committables,
                # the shared files its keyed state references: the coordinator's registry counts them
                "shared": ack_shared(keyed),
                "stats": {
                    "sync_s": p.sync_s,
                    "async_s": time.perf_counter() - t0,
                    "alignment_s": p.alignment_s,
                    "unaligned": p.unaligned,
                    "switched": p.switched,
                    "inflight_bytes": p.channel_state.nbytes,
                    "state_bytes": len(data),
                    **keyed_sizes(keyed),
                },
            }
            check()
            self._responder.acknowledge(task_id, cid, handle)
        except UploadCancelled:
            log.debug("%s: checkpoint %d upload cancelled (the task ended)", self._name, cid)
            _discard(p)
        except Exception as exc:
            log.warning("%s: checkpoint %d upload failed: %s", self._name, cid, exc)
            _discard(p)
            self._responder.decline(task_id, cid, f"{self._name}: upload failed: {exc}")
        except BaseException as exc:  # a crash (simulated ones too): the task fails, as its process would
            self.async_error = exc
            self._spec.signal.notify()

    # -- outcome -------------------------------------------------------------------------------------
    def abort_checkpoint(
        self, checkpoint_id: int, reason: str, failure: CheckpointFailureReason = CheckpointFailureReason.DECLINED
    ) -> None:
        """This subtask gives up ``checkpoint_id``: cancel it downstream and decline it (for ``failure``)."""
        for w in self._spec.all_writers:
            w.broadcast(CancelCheckpointMarker(checkpoint_id, failure.name))
        self.channel_state.abort(checkpoint_id)
        self._drop(checkpoint_id)
        self._responder.decline(self._spec.task_id, checkpoint_id, f"{self._name}: {reason}", failure)

    def notify_complete(self, checkpoint_id: int) -> None:
        """``checkpoint_id`` completed: forget it and older ones, tell operators and the reader."""
        for cid in [c for c in self._pending if c <= checkpoint_id]:
            self._drop(cid)
        for op in self._spec.operators:
            op.notify_checkpoint_complete(checkpoint_id)
        if self._spec.reader is not None:
            self._spec.reader.notify_checkpoint_complete(checkpoint_id)

    def notify_aborted(self, checkpoint_id: int) -> None:
        """The coordinator aborted ``checkpoint_id``: forget it, tell operators."""
        if self._drop(checkpoint_id) is not None:
            self.channel_state.abort(checkpoint_id)
        for op in self._spec.operators:
            op.notify_checkpoint_aborted(checkpoint_id)

    # -- the end of the task ---------------------------------------------------------------------------
    def stop(self, cancel: bool, timeout: float) -> bool:
        """Before the operators close: drop the uploads not started, end the running one (with ``cancel`` at
        its next step, else at its end), and wait up to ``timeout`` seconds for the upload thread. A thread
        still running then is named in a warning; returns False in that case."""
        for cid in [c for c, p in self._pending.items() if not p.submitted]:
            self._drop(cid)
        return self.uploads.stop(cancel, timeout)


def _discard(p: PendingSnapshot) -> None:
    """Release the local resources (a RocksDB checkpoint folder) of keyed snapshots that will not run."""
    for s in p.operators.values():
        if s.keyed is not None:
            s.keyed.discard()
            s.keyed = None


def _aligned(barrier: CheckpointBarrier) -> CheckpointBarrier:
    """The in-order version of ``barrier`` for exchanges that are never unaligned (forward, broadcast)."""
    opts = dataclasses.replace(barrier.options, alignment=AlignmentMode.ALIGNED)
    return CheckpointBarrier(barrier.checkpoint_id, barrier.timestamp, opts)
