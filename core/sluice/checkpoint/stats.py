"""Checkpoint statistics: one record per checkpoint, completed or failed, with per-task details."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["CheckpointStats"]


@dataclass
class CheckpointStats:
    """What ``sluice checkpoints show`` prints for a checkpoint."""

    checkpoint_id: int
    status: str  # "completed" | "failed" | "in_progress"
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

    @property
    def switched_to_unaligned(self) -> bool:
        return any(t.get("switched") for t in self.tasks.values())

    @property
    def is_unaligned(self) -> bool:
        return any(t.get("unaligned") for t in self.tasks.values())

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["switched_to_unaligned"] = self.switched_to_unaligned
        d["unaligned"] = self.is_unaligned
        return d
