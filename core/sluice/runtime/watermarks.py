"""The watermark valve of a task (Flink ``StatusWatermarkValve``).

A task's event time is the minimum of the watermarks of its live input channels. A channel leaves that
minimum while it is *idle* (its upstream reader has nothing to read, announced with
``WatermarkStatus(idle=True)``) or once it *ended*; an idle channel that sends a watermark again rejoins it.
Event time never goes back: a channel that rejoins behind the others holds event time where it is until
it catches up.

A source task has no input channels: its reader sets the watermark directly and may declare itself idle,
which its downstream tasks learn once, through a ``WatermarkStatus`` on every output.
"""

from __future__ import annotations

from collections.abc import Callable

from sluice.operators.base import MIN_WATERMARK

__all__ = ["StatusWatermarkValve"]


class StatusWatermarkValve:
    """Combines per-channel watermarks into the task's watermark and emits each advance once.

    Args:
        num_channels: How many input channels the task has (0 for a source task).
        emit: Called with the new watermark each time the task's watermark advances.
    """

    def __init__(self, num_channels: int, emit: Callable[[int], None]) -> None:
        self._emit = emit
        self._channel_wm = [MIN_WATERMARK] * num_channels
        self._idle_channels: set[int] = set()
        self._ended: set[int] = set()
        self.watermark = MIN_WATERMARK
        #: a source task's own status: True after its reader marked it idle, until its next watermark
        self.source_idle = False

    def input_watermark(self, channel: int, timestamp: int) -> None:
        """``channel`` delivered a watermark: it is active, at ``timestamp``."""
        self._channel_wm[channel] = timestamp
        self._idle_channels.discard(channel)
        self._advance()

    def input_status(self, channel: int, idle: bool) -> None:
        """``channel`` became idle (left out of the minimum) or active again."""
        if idle:
            self._idle_channels.add(channel)
        else:
            self._idle_channels.discard(channel)
        self._advance()

    def end_channel(self, channel: int) -> None:
        """``channel`` ended: it never holds event time back again."""
        self._ended.add(channel)
        self._advance()

    def source_watermark(self, timestamp: int) -> None:
        """A source task's reader emitted a watermark (which also ends its idleness)."""
        self.source_idle = False
        if timestamp > self.watermark:
            self.watermark = timestamp
            self._emit(timestamp)

    def mark_source_idle(self) -> bool:
        """A source task's reader is idle; True if it just became so (downstream must be told once)."""
        if self.source_idle:
            return False
        self.source_idle = True
        return True

    def _advance(self) -> None:
        live = [
            wm
            for i, wm in enumerate(self._channel_wm)
            if i not in self._ended and i not in self._idle_channels
        ]
        wm = min(live) if live else self.watermark
        if wm > self.watermark:
            self.watermark = wm
            self._emit(wm)
