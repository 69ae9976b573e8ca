"""The failure manager on its own: which failed checkpoints count, and when the job fails (issue 23)."""

from __future__ import annotations

import pytest
from sluice.checkpoint.failure_manager import CheckpointFailureManager
from sluice.errors import CheckpointError, CheckpointFailureReason

EXPIRED, DECLINED, SUBSUMED = (
    CheckpointFailureReason.EXPIRED,
    CheckpointFailureReason.DECLINED,
    CheckpointFailureReason.SUBSUMED,
)


def manager(tolerable: int) -> tuple[CheckpointFailureManager, list[BaseException]]:
    fatal: list[BaseException] = []
    return CheckpointFailureManager(tolerable, fatal.append), fatal


def test_more_than_the_tolerable_consecutive_failures_fail_the_job() -> None:
    m, fatal = manager(tolerable=2)
    m.failed(1, EXPIRED, "slow", counts=True)
    m.failed(2, DECLINED, "disk", counts=True)
    assert m.consecutive == 2 and not fatal
    m.failed(3, EXPIRED, "slow again", counts=True)
    assert len(fatal) == 1 and isinstance(fatal[0], CheckpointError)
    assert fatal[0].reason is EXPIRED and fatal[0].checkpoint_id == 3
    assert "3 consecutive failed checkpoints, tolerable_failed_checkpoints=2" in str(fatal[0])


def test_a_completed_checkpoint_resets_the_count() -> None:
    m, fatal = manager(tolerable=1)
    m.failed(1, EXPIRED, "", counts=True)
    m.completed()
    m.failed(3, EXPIRED, "", counts=True)
    assert m.consecutive == 1 and not fatal


@pytest.mark.parametrize("reason", list(CheckpointFailureReason))
def test_only_reasons_about_the_jobs_health_count(reason: CheckpointFailureReason) -> None:
    m, fatal = manager(tolerable=0)
    m.failed(1, reason, "", counts=True)
    assert m.consecutive == int(reason.counts_toward_tolerable)
    assert len(fatal) == int(reason.counts_toward_tolerable)


def test_savepoints_and_stops_never_count() -> None:
    m, fatal = manager(tolerable=0)
    m.failed(1, EXPIRED, "", counts=False)
    m.failed(2, SUBSUMED, "", counts=True)
    assert m.consecutive == 0 and not fatal
