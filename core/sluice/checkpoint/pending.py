"""A checkpoint between its trigger and its completion (Flink's ``PendingCheckpoint``).

A pending checkpoint knows which subtasks still owe an acknowledgement and what each one acknowledged.
Once every subtask acknowledged, :meth:`PendingCheckpoint.finalize` writes what the driver holds (the state
of finished subtasks), then the checkpoint's metadata **last** (state paths relative to its folder), and
returns the :class:`CompletedCheckpoint`. A write that fails raises :class:`FinalizeError`: the coordinator
aborts the checkpoint (``STORAGE_FAILURE``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sluice.checkpoint.codec import MetadataCodec
from sluice.checkpoint.global_commit import CommitGroups
from sluice.checkpoint.handles import AckResult
from sluice.checkpoint.history import relative_handle
from sluice.checkpoint.storage import CheckpointStorage
from sluice.errors import CheckpointError
from sluice.events import CheckpointBarrier, CheckpointKind
from sluice.graph import SubtaskId

__all__ = ["CompletedCheckpoint", "FinalizeError", "PendingCheckpoint"]


class FinalizeError(Exception):
    """Writing a checkpoint's files failed (after the storage's retries); the message is the cause's."""


@dataclass(frozen=True)
class CompletedCheckpoint:
    """A checkpoint whose metadata is written: what the coordinator records, commits and announces."""

    checkpoint_id: int
    #: the checkpoint's folder (``.../chk-<n>`` or ``.../savepoint-<n>``)
    directory: str
    savepoint: bool
    #: seconds from the trigger to the metadata written
    duration: float
    #: every subtask's acknowledgement as the metadata records it (state written by the driver: a path)
    acks: dict[SubtaskId, dict[str, Any]]
    #: the committables this checkpoint hands to each global committer, by sink uid
    committables: dict[str, list[Any]]


@dataclass
class PendingCheckpoint:
    """Checkpoint ``checkpoint_id``: the subtasks it waits for and what the others acknowledged.

    Attributes:
        waiting: Subtasks that have not acknowledged yet.
        acks: Each subtask's acknowledgement (its state handle).
        enumerators: The source enumerators' states, taken at the trigger.
        done: Set once the checkpoint completed or was aborted (``error`` says which).
    """

    checkpoint_id: int
    barrier: CheckpointBarrier
    waiting: set[SubtaskId]
    acks: dict[SubtaskId, dict[str, Any]] = field(default_factory=dict)
    enumerators: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)
    error: CheckpointError | None = None

    @property
    def savepoint(self) -> bool:
        return self.barrier.options.kind is CheckpointKind.SAVEPOINT

    @property
    def fully_acknowledged(self) -> bool:
        return not self.waiting

    def acknowledge(self, task: SubtaskId, handle: dict[str, Any]) -> AckResult:
        """Record ``task``'s acknowledgement: SUCCESS, or DUPLICATE if it is not waited for."""
        if task not in self.waiting:
            return AckResult.DUPLICATE
        self.waiting.discard(task)
        self.acks[task] = handle
        return AckResult.SUCCESS

    def abort(self, error: CheckpointError) -> None:
        """The checkpoint failed with ``error``: whoever waits for it is woken."""
        self.error = error
        self.done.set()

    def finalize(
        self,
        storage: CheckpointStorage,
        codec: MetadataCodec,
        job_info: dict[str, Any],
        committed_upto: int,
        uncommitted: Callable[[], dict[str, CommitGroups]],
    ) -> CompletedCheckpoint:
        """Write the state the driver holds and then the metadata; return the completed checkpoint.

        Args:
            storage: The job's checkpoint storage.
            codec: Seals the metadata and encodes enumerator states and global committables.
            job_info: The metadata's header (job id, attempt, vertices).
            committed_upto: Committables of checkpoints up to this one were handed to the global committers
                already (a failed checkpoint's committables come again with later acknowledgements).
            uncommitted: The committables of earlier checkpoints whose global commit has not returned yet.

        Raises:
            FinalizeError: a write failed.
        """
        cid = self.checkpoint_id
        duration = time.monotonic() - self.started
        folder = storage.checkpoint_dir(cid, self.savepoint)
        try:
            self._write_driver_state(storage)
        except Exception as exc:
            raise FinalizeError(str(exc)) from exc
        committables = self._new_committables(committed_upto)
        metadata = {
            **job_info,
            "checkpoint_id": cid,
            "kind": self.barrier.options.kind.value,
            "alignment": self.barrier.options.alignment.value,
            "trigger_time": self.barrier.timestamp,
            "duration_s": duration,
            "tasks": {
                str(t): relative_handle({k: v for k, v in h.items() if k != "committables"}, folder)
                for t, h in sorted(self.acks.items(), key=lambda kv: (kv[0].vertex, kv[0].index))
            },
            "enumerators": self.enumerators,
            "global_committables": codec.global_committables(_groups(cid, committables, uncommitted())),
        }
        try:
            path = storage.write_metadata(cid, codec.seal(metadata), self.savepoint)
        except Exception as exc:
            raise FinalizeError(str(exc)) from exc
        directory = path.rsplit("/", 1)[0]
        return CompletedCheckpoint(cid, directory, self.savepoint, duration, self.acks, committables)

    def _write_driver_state(self, storage: CheckpointStorage) -> None:
        """Finished subtasks acknowledge with their state's bytes: the driver writes them into this folder,
        under a name of their own: the subtask may still be writing its snapshot of this checkpoint (begun
        before it finished) to ``<vertex>-<index>.state``, which must not replace the state acknowledged."""
        for t, h in list(self.acks.items()):
            if h.get("data") is not None:
                path = storage.write_task_state(
                    self.checkpoint_id, f"{t.vertex}-{t.index}.final.state", h["data"], self.savepoint
                )
                self.acks[t] = {k: v for k, v in h.items() if k != "data"} | {"path": path}

    def _new_committables(self, committed_upto: int) -> dict[str, list[Any]]:
        committables: dict[str, list[Any]] = {}
        for h in self.acks.values():
            for sink_name, c in h.get("committables") or []:
                # a failed checkpoint's committables come again with later acknowledgements until a
                # completed checkpoint took them: take each once
                if c.checkpoint_id > committed_upto:
                    committables.setdefault(sink_name, []).append(c.committable)
        return committables


def _groups(
    cid: int, committables: dict[str, list[Any]], uncommitted: dict[str, CommitGroups]
) -> dict[str, CommitGroups]:
    """What checkpoint ``cid``'s metadata records for global committers: the committables of earlier
    checkpoints whose commit has not returned yet, then its own, by checkpoint (a restore commits them
    in this order)."""
    groups = uncommitted
    for uid, comms in committables.items():
        if comms:
            groups.setdefault(uid, []).append((cid, comms))
    return groups
