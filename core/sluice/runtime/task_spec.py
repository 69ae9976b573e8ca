"""What a task is made of (Flink's ``TaskDeploymentDescriptor``, resolved into live objects).

:func:`sluice.runtime.assembly.build_task` builds a :class:`TaskSpec` per subtask (operators set up with
their chain outputs, channels, writers, the source reader, the restored state); the :class:`Task` runs it
with the services of its runtime (coordinator gateway, checkpoint storage, fault hook).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import pyarrow as pa

from sluice.checkpoint.codec import envelope
from sluice.events import AlignmentMode, EndOfChannelState
from sluice.graph import SubtaskId
from sluice.operators.base import Operator, OperatorContext
from sluice.runtime.channels import InputChannel, Signal
from sluice.runtime.output import RecordWriter
from sluice.serializers import PickleSerializer, SimpleVersionedSerializer
from sluice.source import SourceReader, SourceSplit

__all__ = ["TaskRestore", "TaskSpec"]


@dataclass
class TaskRestore:
    """What a subtask restores from a checkpoint (already redistributed for its index)."""

    checkpoint_id: int
    #: the checkpoint holds in-flight data (and it is not dropped): every subtask of the job sends
    #: ``EndOfChannelState`` on all its outputs once it re-sent its output channel state, and takes nothing
    #: from its inputs after that event before every one of them delivered it (sluice.runtime.input_gate)
    recovers_channel_state: bool = False
    #: node uid -> the keyed state handles of the old subtasks whose key groups overlap this one's
    keyed: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    operator: dict[str, list[Any]] = field(default_factory=dict)  # node uid -> operator states
    #: batches to process before any new input (input channel state), per input index
    replay_input: list[tuple[int, pa.RecordBatch]] = field(default_factory=list)
    #: batches to send before anything else (output channel state), per output writer index
    resend_output: list[tuple[int, pa.RecordBatch]] = field(default_factory=list)
    #: (chain position, input index, batch): in-flight data of a node a rescale chained behind another one,
    #: processed by that operator before the input channel state (sluice.runtime.rechain)
    inject: list[tuple[int, int, pa.RecordBatch]] = field(default_factory=list)

    def recover_channel_state(self, writers: list[RecordWriter], operators: list[Operator]) -> None:
        """Deliver the in-flight data before any new input: output channel state first, then (where the
        checkpoint holds in-flight data) ``EndOfChannelState`` on every output, then the data of rechained
        nodes and the input channel state, processed by the chain (``operators[0]`` is its head)."""
        for idx, batch in self.resend_output:
            writers[idx].emit(batch)
        if self.recovers_channel_state:
            # what follows (from its input channel state, then new input) is newer than every sender's
            # output channel state: receivers hold it until all senders got here (runtime.input_gate)
            for w in writers:
                w.broadcast(EndOfChannelState())
        for pos, input_index, batch in self.inject:
            operators[pos].process_batch(batch, input_index)
        for input_index, batch in self.replay_input:
            operators[0].process_batch(batch, input_index)


@dataclass(frozen=True)
class TaskSpec:
    """One subtask, assembled: its operator chain, channels, writers and what it restores.

    Attributes:
        task_id: Which subtask of which vertex.
        name: The vertex's name.
        operators: The operator chain, each already set up with its context and chain output.
        contexts: The operators' contexts, in chain order.
        inputs: The input channels, in the order the barrier handler numbers them.
        input_index_of: For each input channel, the head operator's input it feeds (0, or 1 for the
            second input of a two-input operator).
        writers: The writers of each output, by (producing node id, side output tag or None).
        signal: The task's wake-up, shared with its channels.
        alignment: How this task handles barriers (already aligned where an input exchange is never
            unaligned: forward and broadcast).
        reader: The source reader if the chain's head is a source.
        restore: What the task restores, None on a fresh start.
        max_batch_rows: Input batches are processed in slices of at most this many rows (0: whole).
        metrics: Count the task's built-in metrics (:mod:`sluice.runtime.task_metrics`).
        checkpoint_key: The job's checkpoint key: signs the task's state files.
        split_serializer: The source's split serializer, if the chain's head is a source.
        stop_timeout: Seconds the ending task waits for its upload thread before it closes its operators
            (``JobConfig.task_cancellation_timeout``).
    """

    task_id: SubtaskId
    name: str
    operators: list[Operator]
    contexts: list[OperatorContext]
    inputs: list[InputChannel]
    input_index_of: list[int]
    writers: dict[tuple[int, str | None], list[RecordWriter]]
    signal: Signal
    alignment: AlignmentMode
    reader: SourceReader | None = None
    restore: TaskRestore | None = None
    max_batch_rows: int = 0
    metrics: bool = True
    checkpoint_key: bytes = field(default=b"", repr=False)
    split_serializer: SimpleVersionedSerializer[SourceSplit] | None = None
    stop_timeout: float = 60.0

    @property
    def subtask_name(self) -> str:
        """``name (i/parallelism)``, as logs and decline reasons name the subtask."""
        return f"{self.name} ({self.task_id.index + 1}/{self.contexts[0].parallelism})"

    def pack_splits(self, splits: list[SourceSplit] | None) -> list[Any] | None:
        """The reader's snapshot as the task state stores it: its split serializer's envelopes."""
        if splits is None:
            return None
        serializer = self.split_serializer or PickleSerializer()
        return [envelope(serializer, s) for s in splits]

    @cached_property
    def all_writers(self) -> list[RecordWriter]:
        """Every writer, in the order output channel state numbers them."""
        return [w for ws in self.writers.values() for w in ws]

    def close(self, quiet: bool = False) -> None:
        """Close the operators (in chain order), then the reader; ``quiet``: a failure to close one is not
        raised and the others are closed still (a failed, cancelled or never started task)."""
        closers: list[Callable[[], None]] = [op.close for op in self.operators]
        for close in closers + ([self.reader.close] if self.reader is not None else []):
            try:
                close()
            except Exception:
                if not quiet:
                    raise
