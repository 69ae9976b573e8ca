"""What a checkpoint coordinator is built from: the tasks it drives, the services it writes to and reports
to, and where its checkpoints go on from (:class:`~sluice.checkpoint.coordinator.CheckpointCoordinator`)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sluice.checkpoint.codec import MetadataCodec
from sluice.checkpoint.completed_store import SharedState
from sluice.checkpoint.global_commit import GlobalCommitQueue
from sluice.checkpoint.handles import TaskHandle
from sluice.checkpoint.storage import CheckpointStorage
from sluice.graph import SubtaskId

__all__ = ["CoordinatedTasks", "CoordinatorServices", "ResumePoint"]

log = logging.getLogger("sluice.checkpoint")


def _log_cleanup_failure(what: str, error: BaseException) -> None:
    log.warning("checkpoint cleanup: %s failed: %s: %s", what, type(error).__name__, error)


@dataclass
class CoordinatedTasks:
    """What a coordinator drives: the running subtasks and the source enumerators it snapshots.

    Attributes:
        tasks: Every subtask of the attempt.
        sources: The source subtasks (a checkpoint is triggered there).
        enumerators: The source enumerators, by source uid.
        lock: Guards the enumerators (shared with whoever else calls them) and the coordinator's state.
    """

    tasks: dict[SubtaskId, TaskHandle]
    sources: set[SubtaskId]
    enumerators: dict[str, Any] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)


@dataclass
class CoordinatorServices:
    """What a coordinator writes to and reports to.

    Attributes:
        storage: The job's checkpoint storage.
        job_info: The header of every checkpoint's metadata (job id, attempt, vertices).
        codec: Seals the metadata (default: with the configuration's checkpoint key).
        global_commits: The ordered commit queue of the sinks that commit globally, if any.
        on_fatal: Called when the job must fail (too many consecutive failed checkpoints).
        on_cleanup_failure: Called with what failed and the error when a cleanup fails (never raised).
        shared_state: The shared-state registry of incremental checkpoints (default: none, every
            checkpoint is a full one), kept by the completed-checkpoint store.
    """

    storage: CheckpointStorage
    job_info: dict[str, Any]
    codec: MetadataCodec | None = None
    global_commits: GlobalCommitQueue | None = None
    on_fatal: Callable[[BaseException], None] = lambda exc: None
    on_cleanup_failure: Callable[[str, BaseException], None] = _log_cleanup_failure
    shared_state: SharedState | None = None


@dataclass(frozen=True)
class ResumePoint:
    """Where an attempt's checkpoints go on from.

    Attributes:
        next_checkpoint_id: The id of the attempt's first checkpoint.
        restored: The checkpoint the attempt restored (id, path), if it is not a savepoint: retained as
            the oldest completed one.
        committed_upto: The last checkpoint whose committables went to the global committers (the
            restored one).
    """

    next_checkpoint_id: int = 1
    restored: tuple[int, str] | None = None
    committed_upto: int = 0
