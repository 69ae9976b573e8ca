"""The watermark valve of a task (Flink ``StatusWatermarkValve``).

A task's event time is the minimum of the watermarks of its live input channels. A channel leaves that
minimum while it is *idle* (its upstream reader has nothing to read, announced with
``WatermarkStatus(idle=True)``) or once it *ended*; an idle channel that sends a watermark again rejoins it.
Event time never goes back: a channel that rejoins behind the others holds event time where it is until
it catches up.

A channel may also be given an *idle timeout* (``join_latest``'s table side, whose quiet topic would
otherwise hold event time back for ever, as Flink's source idleness): once it has delivered anything (a
barrier too: its upstream task runs), a channel that delivers no data and no watermark for that long leaves
the minimum, and rejoins with its next data or watermark.

A source task has no input channels: its reader sets the watermark directly and may declare itself idle,
which its downstream tasks learn once, through a ``WatermarkStatus`` on every output.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from sluice.operators.base import MIN_WATERMARK

__all__ = ["StatusWatermarkValve"]


class StatusWatermarkValve:
    """Combines per-channel watermarks into the task's watermark and emits each advance once.

    Args:
        num_channels: How many input channels the task has (0 for a source task).
        emit: Called with the new watermark each time the task's watermark advances.
        idle_timeouts: Per channel, seconds without data or watermark after which it leaves the minimum
            (None: never).
        clock: Monotonic seconds (injectable for tests).
    """

    def __init__(
        self,
        num_channels: int,
        emit: Callable[[int], None],
        idle_timeouts: Sequence[float | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._emit = emit
        self._channel_wm = [MIN_WATERMARK] * num_channels
        self._idle_channels: set[int] = set()
        self._ended: set[int] = set()
        self.watermark = MIN_WATERMARK
        #: a source task's own status: True after its reader marked it idle, until its next watermark
        self.source_idle = False
        self._clock = clock
        self._timeouts = {i: t for i, t in enumerate(idle_timeouts or ()) if t is not None}
        #: channels with a timeout that delivered something: when they last delivered data or a watermark
        self._active_at: dict[int, float] = {}
        self._timed_out: set[int] = set()

    @property
    def has_idle_timeouts(self) -> bool:
        return bool(self._timeouts)

    def input_watermark(self, channel: int, timestamp: int) -> None:
        """``channel`` delivered a watermark: it is active, at ``timestamp``."""
        self._channel_wm[channel] = timestamp
        self._idle_channels.discard(channel)
        if self._timeouts:
            self.input_data(channel)
        self._advance()

    def input_data(self, channel: int) -> None:
        """``channel`` delivered data (only needed for channels with an idle timeout): it is active again."""
        if channel in self._timeouts:
            self._active_at[channel] = self._clock()
            if channel in self._timed_out:
                self._timed_out.discard(channel)
                self._advance()

    def input_event(self, channel: int) -> None:
        """``channel`` delivered an event (a barrier): its upstream runs, so its idle clock may start."""
        if channel in self._timeouts and channel not in self._active_at:
            self._active_at[channel] = self._clock()

    def check_idle(self) -> None:
        """Leave out of the minimum every channel quiet for longer than its idle timeout."""
        now = self._clock()
        quiet = [
            c
            for c, since in self._active_at.items()
            if c not in self._timed_out and c not in self._ended and now - since >= self._timeouts[c]
        ]
        if quiet:
            self._timed_out.update(quiet)
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
            if i not in self._ended and i not in self._idle_channels and i not in self._timed_out
        ]
        if not live and self._timed_out:  # only quiet channels are left: those that ended count as they ended
            live = [wm for i, wm in enumerate(self._channel_wm) if i in self._ended]
        wm = min(live) if live else self.watermark
        if wm > self.watermark:
            self.watermark = wm
            self._emit(wm)
