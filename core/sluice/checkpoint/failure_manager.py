"""Which failed checkpoints fail the job (Flink's ``CheckpointFailureManager``)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from sluice.errors import CheckpointError, CheckpointFailureReason

__all__ = ["CheckpointFailureManager"]

log = logging.getLogger("sluice.checkpoint")

_QUIET = (
    CheckpointFailureReason.FINISHED,
    CheckpointFailureReason.SUBSUMED,
    CheckpointFailureReason.JOB_CANCELLED,
    CheckpointFailureReason.TASK_NOT_READY,
)


class CheckpointFailureManager:
    """Counts consecutive failed checkpoints; more than ``tolerable`` in a row fail the job (``on_fatal``).

    Only reasons that say something about the job's health count
    (:attr:`CheckpointFailureReason.counts_toward_tolerable`), and never a savepoint or the terminal
    checkpoint of a stop: those are the caller's error to handle (as in Flink).
    """

    def __init__(self, tolerable: int, on_fatal: Callable[[BaseException], None]) -> None:
        self.tolerable = tolerable
        self.on_fatal = on_fatal
        #: failed checkpoints since the last one that completed
        self.consecutive = 0

    def completed(self) -> None:
        self.consecutive = 0

    def failed(self, checkpoint_id: int, reason: CheckpointFailureReason, detail: str, counts: bool) -> None:
        """Checkpoint ``checkpoint_id`` failed; ``counts`` is False for savepoints and stops."""
        if reason not in _QUIET:
            log.warning("checkpoint %d failed: %s %s", checkpoint_id, reason.message, detail)
        if not (reason.counts_toward_tolerable and counts):
            return
        self.consecutive += 1
        if self.consecutive > self.tolerable:
            self.on_fatal(
                CheckpointError(
                    reason,
                    f"{detail} ({self.consecutive} consecutive failed checkpoints, "
                    f"tolerable_failed_checkpoints={self.tolerable})",
                    checkpoint_id,
                )
            )
