"""Checkpoint statistics: one record per checkpoint, completed or failed, with per-task details, and the
coordinator's bounded history of them with totals over every checkpoint (:class:`CheckpointStatsTracker`)."""

from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from sluice.errors import IllegalTransitionError

__all__ = ["DURATION_BUCKETS", "CheckpointCounts", "CheckpointStats", "CheckpointStatsTracker", "CheckpointStatus"]

#: upper bounds (seconds) of the buckets completed checkpoints are counted in by end-to-end duration
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class CheckpointStatus(enum.StrEnum):
    """Where a checkpoint is: in progress until it completes or fails. The values are what the stats
    history (``_stats/``) holds and ``sluice checkpoints list|show`` prints."""

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


@dataclass
class CheckpointCounts:
    """Totals over every checkpoint of a job (its history keeps only the newest ones): what counters and
    the duration histogram of the metrics endpoint are made of.

    Attributes:
        completed: checkpoints (and savepoints) completed.
        failed: checkpoints that failed (expired, declined, aborted, ...).
        switched_to_unaligned: completed adaptive checkpoints that switched from aligned to unaligned.
        duration_s_sum: the end-to-end durations of the completed ones, added up.
        duration_buckets: completed ones with a duration at or below each of :data:`DURATION_BUCKETS`.
    """

    completed: int = 0
    failed: int = 0
    switched_to_unaligned: int = 0
    duration_s_sum: float = 0.0
    duration_buckets: list[int] = field(default_factory=lambda: [0] * len(DURATION_BUCKETS))

    def count(self, stats: CheckpointStats) -> None:
        """Count one checkpoint that completed or failed."""
        if stats.status is CheckpointStatus.FAILED:
            self.failed += 1
            return
        self.completed += 1
        self.switched_to_unaligned += int(stats.switched_to_unaligned)
        self.duration_s_sum += stats.duration_s
        for i, bound in enumerate(DURATION_BUCKETS):
            if stats.duration_s <= bound:
                self.duration_buckets[i] += 1

    @classmethod
    def total(cls, counts: Iterable[CheckpointCounts]) -> CheckpointCounts:
        """The sum of several counts (a job's attempts)."""
        out = cls()
        for c in counts:
            out.completed += c.completed
            out.failed += c.failed
            out.switched_to_unaligned += c.switched_to_unaligned
            out.duration_s_sum += c.duration_s_sum
            out.duration_buckets = [a + b for a, b in zip(out.duration_buckets, c.duration_buckets, strict=True)]
        return out


class CheckpointStatsTracker:
    """A coordinator's stats history: a record per checkpoint from its trigger, written to the job's stats
    history (:class:`~sluice.checkpoint.stats_log.CheckpointStatsLog`) when it completes or fails. As
    Flink's ``CheckpointStatsTracker``, it keeps the newest ``history_size`` records (``history``) and
    totals over all of them (``counts``), so its memory does not grow with the number of checkpoints.

    Args:
        write: Writes one record to the job's stats history.
        report: Called with what failed and the error when ``write`` fails (never raised).
        history_size: Records kept in ``history``.
    """

    def __init__(
        self,
        write: Callable[[dict[str, Any]], None],
        report: Callable[[str, BaseException], None],
        history_size: int = 100,
    ) -> None:
        self._write = write
        self._report = report
        #: the newest checkpoints of the attempt, in trigger order
        self.history: deque[CheckpointStats] = deque(maxlen=history_size)
        #: totals over every checkpoint of the attempt that completed or failed
        self.counts = CheckpointCounts()
        #: the newest failed checkpoint, kept when it drops out of ``history``
        self.latest_failed: CheckpointStats | None = None
        self._in_progress: dict[int, CheckpointStats] = {}

    @property
    def in_progress(self) -> int:
        """Checkpoints triggered that neither completed nor failed yet."""
        return len(self._in_progress)

    def triggered(self, checkpoint_id: int, trigger_time: float, kind: str, alignment: str) -> None:
        stats = CheckpointStats(
            checkpoint_id, CheckpointStatus.IN_PROGRESS, trigger_time, kind=kind, alignment=alignment
        )
        self._in_progress[checkpoint_id] = stats
        self.history.append(stats)

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
        self.latest_failed = stats
        self._record(stats)

    def _get(self, checkpoint_id: int) -> CheckpointStats:
        s = self._in_progress.pop(checkpoint_id, None)
        if s is None:  # ended already (its finish() refuses a second end), or never triggered here
            s = next((h for h in reversed(self.history) if h.checkpoint_id == checkpoint_id), None)
        if s is None:
            s = CheckpointStats(checkpoint_id, CheckpointStatus.IN_PROGRESS, time.time())
            self.history.append(s)
        return s

    def _record(self, stats: CheckpointStats) -> None:
        self.counts.count(stats)
        try:
            self._write(stats.to_dict())
        except Exception as exc:
            self._report(f"recording stats of checkpoint {stats.checkpoint_id}", exc)
