"""The watermark valve on its own: per-channel watermarks, idle and ended channels, a source's idleness."""

from __future__ import annotations

from sluice.operators.base import MIN_WATERMARK
from sluice.runtime.watermarks import StatusWatermarkValve


def valve(n: int) -> tuple[StatusWatermarkValve, list[int]]:
    seen: list[int] = []
    return StatusWatermarkValve(n, seen.append), seen


def test_event_time_is_the_minimum_over_channels_and_only_advances() -> None:
    v, seen = valve(3)
    v.input_watermark(0, 100)
    v.input_watermark(1, 50)
    assert seen == [] and v.watermark == MIN_WATERMARK  # channel 2 has no watermark yet
    v.input_watermark(2, 70)
    assert seen == [50]
    v.input_watermark(1, 80)
    assert seen == [50, 70]
    v.input_watermark(2, 60)  # a channel going back does not take event time back
    v.input_watermark(2, 65)
    assert seen == [50, 70] and v.watermark == 70
    v.input_watermark(2, 200)
    assert seen == [50, 70, 80]


def test_idle_channels_leave_the_minimum_until_their_next_watermark() -> None:
    v, seen = valve(2)
    v.input_watermark(0, 100)
    v.input_status(1, idle=True)
    assert seen == [100]
    v.input_watermark(1, 50)  # active again, behind: holds event time where it is
    v.input_watermark(0, 300)
    assert seen == [100]
    v.input_watermark(1, 200)
    assert seen == [100, 200]
    v.input_status(1, idle=True)
    assert seen == [100, 200, 300]
    v.input_status(1, idle=False)  # active without a watermark: back at its last one
    v.input_watermark(0, 400)
    assert seen == [100, 200, 300]


def test_all_channels_idle_or_ended_hold_event_time() -> None:
    v, seen = valve(2)
    v.input_watermark(0, 10)
    v.input_watermark(1, 20)
    v.input_status(0, idle=True)
    assert seen == [10, 20]
    v.end_channel(1)
    assert seen == [10, 20] and v.watermark == 20  # nothing live: no advance, and no regression
    v.input_watermark(0, 15)
    assert seen == [10, 20]
    v.input_watermark(0, 30)
    assert seen == [10, 20, 30]


def test_an_ended_channel_never_holds_event_time_back() -> None:
    v, seen = valve(2)
    v.input_watermark(0, 500)
    v.end_channel(1)
    assert seen == [500]


def test_source_idleness_is_reported_once_per_idle_period() -> None:
    v, seen = valve(0)
    assert v.mark_source_idle() and v.source_idle
    assert not v.mark_source_idle()
    v.source_watermark(10)
    assert not v.source_idle and seen == [10]
    v.source_watermark(5)
    assert seen == [10]
    assert v.mark_source_idle()


def test_a_channel_with_an_idle_timeout_leaves_the_minimum_while_quiet_and_rejoins_when_it_delivers() -> None:
    """join_latest's table side: quiet for its timeout (counted once it delivered anything, a barrier too),
    it no longer holds event time back; its next data or watermark brings it back (behind: it holds event
    time where it is until it catches up); a quiet channel next to an ended one lets the ended one's last
    watermark through."""
    now = [0.0]
    seen: list[int] = []
    v = StatusWatermarkValve(3, seen.append, [None, 5.0, 5.0], clock=lambda: now[0])
    v.input_watermark(0, 100)
    now[0] = 60.0
    v.check_idle()
    assert seen == []  # channels 1 and 2 never delivered anything: their upstream may not run yet
    v.input_event(1)  # a barrier: channel 1's upstream runs
    v.input_data(2)
    v.input_watermark(2, 90)
    now[0] = 64.0
    v.check_idle()
    assert seen == []
    now[0] = 65.0
    v.check_idle()  # channel 1 quiet for 5 s since its barrier, channel 2 since its watermark
    assert seen == [100] and v.watermark == 100
    v.input_watermark(0, 300)
    assert seen == [100, 300]
    v.input_data(1)  # data again: back in the minimum at its watermark (none yet): event time stays
    v.input_watermark(0, 400)
    assert seen == [100, 300]
    v.input_watermark(1, 350)  # channel 1 holds event time at its own (channel 2 is still quiet)
    v.input_watermark(1, 500)
    assert seen == [100, 300, 350, 400]
    v.input_watermark(0, 900)
    v.end_channel(0)
    now[0] = 80.0
    v.check_idle()  # 1 and 2 quiet, 0 ended: its last watermark counts
    assert seen == [100, 300, 350, 400, 500, 900]
