"""Checkpoint statistics: one record per checkpoint, completed or failed, with per-task details, and the
coordinator's history of them (:class:`CheckpointStatsTracker`)."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from sluice.errors import IllegalTransitionError

__all__ = ["CheckpointStats", "CheckpointStatsTracker", "CheckpointStatus"]


class CheckpointStatus(enum.StrEnum):
    """Where a checkpoint is: in progress until it completes or fails. The values are what
    ``_stats.jsonl`` holds and ``sluice checkpoints list|show`` prints."""

    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"


@dataclass
class CheckpointStats:
    """What ``sluice checkpoints show`` prints for a checkpoint."""

    checkpoint_id: int
    status: CheckpointStatus
    trigger_time: float
    kind: str = "checkpoint"
    alignment: str = "aligned"
    duration_s: float = 0.0
    state_bytes: int = 0
    inflight_bytes: int = 0
    failure_reason: str | None = None
    failure_detail: str | None = None
    path: str | None = None
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)

    def finish(self, status: CheckpointStatus) -> None:
        """Record the outcome; a checkpoint completes or fails once, from in progress."""
        if self.status is not CheckpointStatus.IN_PROGRESS or status is CheckpointStatus.IN_PROGRESS:
            raise IllegalTransitionError(
                f"checkpoint {self.checkpoint_id}: cannot go from {self.status} to {status} "
                "(a checkpoint completes or fails once, from in_progress); this is a bug in sluice"
            )
        self.status = status

    @property
    def switched_to_unaligned(self) -> bool:
        return any(t.get("switched") for t in self.tasks.values())

    def completed(self, duration_s: float, path: str, acks: Mapping[Any, Mapping[str, Any]]) -> None:
        """Record a completion: where it is, how long it took, and every task's acknowledgement."""
        self.finish(CheckpointStatus.COMPLETED)
        self.duration_s = duration_s
        self.path = path
        self.tasks = {str(t): dict(h.get("stats") or {}) for t, h in acks.items()}
        self.state_bytes = sum(int(h.get("size") or 0) for h in acks.values())
        self.inflight_bytes = sum(int(s.get("inflight_bytes", 0)) for s in self.tasks.values())
        if self.is_unaligned:
            self.alignment = "unaligned"

    @property
    def is_unaligned(self) -> bool:
        return any(t.get("unaligned") for t in self.tasks.values())

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        d["switched_to_unaligned"] = self.switched_to_unaligned
        d["unaligned"] = self.is_unaligned
        return d


class CheckpointStatsTracker:
    """A coordinator's stats history: a record per checkpoint from its trigger, appended to the job's
    stats file when it completes or fails (Flink's ``CheckpointStatsTracker``).

    Args:
        write: Appends one record to the job's stats history (``CheckpointStorage.record_stats``).
        report: Called with what failed and the error when ``write`` fails (never raised).
    """

    def __init__(
        self, write: Callable[[dict[str, Any]], None], report: Callable[[str, BaseException], None]
    ) -> None:
        self._write = write
        self._report = report
        #: every checkpoint of the attempt, in trigger order
        self.history: list[CheckpointStats] = []

    def triggered(self, checkpoint_id: int, trigger_time: float, kind: str, alignment: str) -> None:
        self.history.append(
            CheckpointStats(checkpoint_id, CheckpointStatus.IN_PROGRESS, trigger_time, kind=kind, alignment=alignment)
        )

    def completed(
        self, checkpoint_id: int, duration_s: float, path: str, acks: Mapping[Any, Mapping[str, Any]]
    ) -> CheckpointStats:
        stats = self._get(checkpoint_id)
        stats.completed(duration_s, path, acks)
        self._record(stats)
        return stats

    def failed(self, checkpoint_id: int, reason: str, detail: str, duration_s: float) -> None:
        stats = self._get(checkpoint_id)
        stats.finish(CheckpointStatus.FAILED)
        stats.failure_reason = reason
        stats.failure_detail = detail
        stats.duration_s = duration_s
        self._record(stats)

    def _get(self, checkpoint_id: int) -> CheckpointStats:
        for s in reversed(self.history):
            if s.checkpoint_id == checkpoint_id:
                return s
        s = CheckpointStats(checkpoint_id, CheckpointStatus.IN_PROGRESS, time.time())
        self.history.append(s)
        return s

    def _record(self, stats: CheckpointStats) -> None:
        try:
            self._write(stats.to_dict())
        except Exception as exc:
            self._report(f"recording stats of checkpoint {stats.checkpoint_id}", exc)
