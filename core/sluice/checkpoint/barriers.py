"""Barrier handling built per mode: :func:`barrier_handler` (the modes and their handlers).

* aligned, unaligned, timeout-adaptive (exactly-once): one checkpoint at a time
  (:class:`~sluice.checkpoint.single_barrier_handler.SingleCheckpointBarrierHandler`, a small state
  machine whose states are in :mod:`sluice.checkpoint.barrier_states`);
* at-least-once: never block; snapshot when a checkpoint's last barrier arrives
  (:class:`~sluice.checkpoint.barrier_tracker.CheckpointBarrierTracker`, several checkpoints at once).

Whatever the mode, a savepoint aligns, and a priority (unaligned) barrier is never blocked behind: the data
it overtook precedes it, so the checkpoint continues unaligned (ARCHITECTURE.md section 4). Events of a
checkpoint older than the one in progress are ignored: it was skipped here because a newer one came first.
The handler acts on the two halves of its task (:mod:`sluice.checkpoint.barrier_handler`): the input gate
and the subtask's checkpointing.
"""

from __future__ import annotations

import time

from sluice.checkpoint.barrier_handler import BarrierHandler, CheckpointableInput, CheckpointingTarget, Clock
from sluice.checkpoint.barrier_tracker import CheckpointBarrierTracker
from sluice.checkpoint.single_barrier_handler import SingleCheckpointBarrierHandler
from sluice.events import AlignmentMode

__all__ = [
    "BarrierHandler",
    "CheckpointBarrierTracker",
    "CheckpointableInput",
    "CheckpointingTarget",
    "SingleCheckpointBarrierHandler",
    "barrier_handler",
]


def barrier_handler(
    mode: AlignmentMode,
    num_channels: int,
    inputs: CheckpointableInput,
    checkpointing: CheckpointingTarget,
    *,
    clock: Clock = time.time,
) -> BarrierHandler:
    """The barrier handler of ``mode`` for a task with ``num_channels`` input channels.

    Args:
        mode: How the task handles barriers.
        num_channels: The task's input channels.
        inputs: The input half (the task's input gate).
        checkpointing: The checkpointing half (the subtask's checkpointing).
        clock: Wall-clock seconds (the timeout-adaptive mode compares it with the barrier's trigger time).
    """
    if mode is AlignmentMode.AT_LEAST_ONCE:
        return CheckpointBarrierTracker(num_channels, inputs, checkpointing)
    return SingleCheckpointBarrierHandler(num_channels, inputs, checkpointing, mode, clock=clock)
