"""When an in-progress file is closed ("rolled") and a new one started in its bucket."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import cast

from sluice.durations import to_seconds
from sluice.errors import ConfigError

__all__ = ["RollingPolicy"]


@dataclass(frozen=True)
class RollingPolicy:
    """Roll a bucket's file on size, age or inactivity; every file also rolls at each checkpoint.

    Rolling at each checkpoint (Flink's ``OnCheckpointRollingPolicy``) is what lets a checkpoint's
    pre-commit hand over every byte written before its barrier; compaction then merges the small files
    this produces.

    Attributes:
        max_size: bytes; a file reaching it is rolled (Parquet counts buffered, not yet encoded rows at
            their Arrow size).
        rollover_interval: time since the file was opened (a duration: ``"15 min"``, a timedelta, seconds),
            or None.
        inactivity_interval: time without a write to the file (a duration), or None.
    """

    max_size: int = 128 * 1024 * 1024
    rollover_interval: float | str | timedelta | None = None
    inactivity_interval: float | str | timedelta | None = None

    def __post_init__(self) -> None:  # durations are kept as float seconds
        for opt in ("rollover_interval", "inactivity_interval"):
            v = getattr(self, opt)
            if v is not None:  # a duration (sluice.durations): "15 min", a timedelta or seconds
                object.__setattr__(self, opt, to_seconds(v, f"FileSink: rolling.{opt}"))

    def validate(self) -> None:
        """Raise ConfigError naming the option and the allowed values."""
        if not isinstance(self.max_size, int) or isinstance(self.max_size, bool) or self.max_size < 1:
            raise ConfigError(
                f"FileSink: rolling.max_size must be an integer number of bytes >= 1 (got {self.max_size!r})"
            )
        for opt in ("rollover_interval", "inactivity_interval"):
            v = getattr(self, opt)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or v <= 0):
                raise ConfigError(
                    f"FileSink: rolling.{opt} must be a number of seconds > 0, or None (got {v!r})"
                )

    def should_roll(self, size: int, opened_at: float, now: float) -> bool:
        """After a write: roll on size or age."""
        if size >= self.max_size:
            return True
        return self.rollover_interval is not None and now - opened_at >= cast(float, self.rollover_interval)

    def inactive(self, last_write: float, now: float) -> bool:
        """Whether a file not written since ``last_write`` should be rolled."""
        return self.inactivity_interval is not None and now - last_write >= cast(float, self.inactivity_interval)
