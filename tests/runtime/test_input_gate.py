"""The input gate on its own, over real channels and a real barrier handler: round robin, alignment
blocking, events-only polling, end of partition, unaligned barriers, barrier pull-forward, and the channels
held after a restore until every sender re-sent its recovered in-flight data."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from sluice.checkpoint.barriers import barrier_handler
from sluice.errors import CheckpointFailureReason
from sluice.events import (
    AlignmentMode,
    CancelCheckpointMarker,
    CheckpointBarrier,
    CheckpointOptions,
    EndOfChannelState,
    EndOfPartition,
    Watermark,
)
from sluice.runtime.channels import LocalChannel, Signal
from sluice.runtime.input_gate import InputGate
from sluice.runtime.watermarks import StatusWatermarkValve

DECLINED = CheckpointFailureReason.DECLINED


def batch(tag: int, n: int = 1) -> pa.RecordBatch:
    return pa.record_batch({"x": [tag] * n})


class Rig:
    """A gate with n channels, wired like a task wires it; the checkpointing side is a log."""

    def __init__(self, n: int, mode: AlignmentMode = AlignmentMode.ALIGNED, credits: int = 4) -> None:
        sig = Signal()
        self.channels = [LocalChannel(sig, credits=credits, output_capacity=16) for _ in range(n)]
        self.got: list[tuple[int, int]] = []  # (channel, first value) of each processed batch
        self.watermarks: list[int] = []
        self.faults: list[str] = []
        self.log: list[tuple[Any, ...]] = []
        self.ended = 0
        self.gate = InputGate(
            self.channels,  # type: ignore[arg-type]
            lambda gate: barrier_handler(mode, n, gate, self),
            StatusWatermarkValve(n, self.watermarks.append),
            lambda ch, b: self.got.append((ch, b.column("x")[0].as_py())),
            self._end,
            self.faults.append,
        )
        self.handler = self.gate.handler

    def _end(self) -> None:
        self.ended += 1

    def drain(self, events_only: bool = False) -> int:
        k = 0
        while self.gate.poll(events_only):
            k += 1
        return k

    # -- the checkpointing half (the gate is the input half) ------------------------------------------
    def perform_checkpoint(self, barrier: CheckpointBarrier, unaligned: bool) -> None:
        self.log.append(("snapshot", barrier.checkpoint_id, unaligned, list(self.got)))

    def start_recording(self, cid: int, channels: set[int], overtaken: dict[int, list[Any]]) -> None:
        values = {c: [b.column("x")[0].as_py() for b in bs] for c, bs in overtaken.items()}
        self.log.append(("record", cid, sorted(channels), values))

    def stop_recording(self, channel: int) -> None:
        self.log.append(("stop", channel))

    def add_overtaken(self, cid: int, channel: int, batches: list[Any]) -> None:
        self.log.append(("overtaken", channel, len(batches)))

    def finish_recording(self, cid: int) -> None:
        self.log.append(("finish", cid))

    def abort_checkpoint(self, cid: int, reason: str, failure: CheckpointFailureReason = DECLINED) -> None:
        self.log.append(("abort", cid) if failure is DECLINED else ("abort", cid, failure.name))

    def alignment_done(self, cid: int, s: float, switched: bool) -> None:
        self.log.append(("aligned", cid, switched))


def barrier(cid: int, mode: AlignmentMode = AlignmentMode.ALIGNED, timeout: float = 0.0) -> CheckpointBarrier:
    return CheckpointBarrier(cid, 0.0, CheckpointOptions(alignment=mode, alignment_timeout=timeout))


def test_round_robin_takes_one_item_per_channel_in_turn() -> None:
    r = Rig(3)
    for ch, tags in ((0, [1, 2, 3]), (1, [10]), (2, [20, 21])):
        for t in tags:
            r.channels[ch].send(batch(t))
    assert r.drain() == 6
    assert r.got == [(0, 1), (1, 10), (2, 20), (0, 2), (2, 21), (0, 3)]
    assert not r.gate.poll()


def test_aligned_barrier_blocks_its_channel_until_the_last_barrier() -> None:
    r = Rig(2)
    r.channels[0].send(barrier(1))
    r.channels[0].send(batch(1))  # after the barrier: belongs to the next checkpoint
    r.channels[1].send(batch(10))
    r.channels[1].send(batch(11))
    r.channels[1].send(barrier(1))
    assert r.gate.poll() and r.gate.blocked == {0}
    assert r.faults == ["align"]  # one channel still to deliver its barrier
    r.drain()
    # channel 0's batch waited for the alignment: the snapshot saw only pre-barrier data
    assert r.log[0] == ("snapshot", 1, False, [(1, 10), (1, 11)])
    assert r.got == [(1, 10), (1, 11), (0, 1)] and r.gate.blocked == set()
    assert r.faults == ["align"]  # the last barrier completes alignment: no fault point


def test_events_only_polling_takes_events_at_the_head_and_leaves_data() -> None:
    r = Rig(2)
    r.channels[0].send(batch(1))
    r.channels[0].send(barrier(1))
    r.channels[1].send(barrier(1))
    r.channels[1].send(batch(10))
    assert r.gate.poll(events_only=True)
    assert r.gate.blocked == {1} and r.got == []
    assert not r.gate.poll(events_only=True)  # channel 0's head is data
    assert r.gate.poll() and r.got == [(0, 1)]
    r.drain(events_only=True)
    assert ("snapshot", 1, False, [(0, 1)]) in r.log and r.got == [(0, 1)]


def test_end_of_partition_ends_alignment_event_time_and_input() -> None:
    r = Rig(2)
    r.channels[0].send(Watermark(100))
    r.channels[0].send(barrier(1))
    r.channels[1].send(Watermark(50))
    r.channels[1].send(EndOfPartition())
    r.drain()
    # channel 1 ended: it neither holds the alignment nor event time back
    assert r.log[0][:2] == ("snapshot", 1) and r.gate.blocked == set()
    assert r.watermarks == [50, 100] and r.gate.ended == {1} and r.ended == 0
    r.channels[1].send(batch(1))  # nothing is taken from an ended channel
    r.channels[0].send(EndOfPartition())
    r.drain()
    assert r.ended == 1 and r.got == []


def test_cancel_marker_aborts_the_alignment_and_unblocks() -> None:
    r = Rig(2)
    r.channels[0].send(barrier(1))
    r.channels[1].send(CancelCheckpointMarker(1))
    r.drain()
    assert ("abort", 1) in r.log and r.gate.blocked == set()
    assert not any(e[0] == "snapshot" for e in r.log)


def test_unaligned_barrier_hands_its_overtaken_input_to_the_handler() -> None:
    r = Rig(2, AlignmentMode.UNALIGNED)
    r.channels[0].send(batch(1))
    r.channels[0].send(batch(2))
    r.channels[0].send_priority(barrier(1, AlignmentMode.UNALIGNED))
    r.channels[1].send(batch(10))
    r.channels[1].send_priority(barrier(1, AlignmentMode.UNALIGNED))
    assert r.gate.poll()
    assert r.log[:2] == [("snapshot", 1, True, []), ("record", 1, [1], {0: [1, 2]})]
    r.drain()
    assert ("overtaken", 1, 1) in r.log and r.log[-2:] == [("aligned", 1, False), ("finish", 1)]
    # the overtaken batches are still processed, after the barrier
    assert sorted(r.got) == [(0, 1), (0, 2), (1, 10)]


def test_adaptive_switch_pulls_a_queued_barrier_forward() -> None:
    r = Rig(2, AlignmentMode.ADAPTIVE)
    r.channels[0].send(barrier(1, AlignmentMode.ADAPTIVE, timeout=0.001))
    r.channels[1].send(batch(10))
    r.channels[1].send(batch(11))
    r.channels[1].send(barrier(1, AlignmentMode.ADAPTIVE, timeout=0.001))
    assert r.gate.poll() and r.gate.blocked == {0}
    r.handler.check_timeout()  # the barrier's timestamp is long past: switch to unaligned
    assert r.gate.blocked == set()
    assert ("record", 1, [1], {1: [10, 11]}) in r.log
    r.drain()  # the pulled barrier comes first, then the data it overtook
    assert r.got == [(1, 10), (1, 11)]
    assert r.log[-3:] == [("stop", 1), ("aligned", 1, True), ("finish", 1)]


def restored(n: int, mode: AlignmentMode = AlignmentMode.ALIGNED) -> Rig:
    r = Rig(n, mode)
    r.gate.expect_recovered_data()
    return r


def test_after_a_restore_no_channel_delivers_past_its_end_of_channel_state_before_all_did() -> None:
    """Channel 0's sender re-sends a partition's recovered records (1, 2, 3); the partition moved to channel
    2's sender, which reads on (20, 21). Round robin took 20 before 2 (issue 38): a channel that delivered
    EndOfChannelState is held, events included, until every channel did."""
    r = restored(3)
    for item in (batch(1), batch(2), batch(3), EndOfChannelState(), batch(4), Watermark(5)):
        r.channels[0].send(item)
    r.channels[1].send(EndOfChannelState())
    r.channels[1].send(EndOfPartition())  # held too: it ends nothing before the others' recovered data
    for item in (EndOfChannelState(), Watermark(7), batch(20), batch(21)):
        r.channels[2].send(item)
    while r.gate.recovering():
        assert r.gate.poll()
        assert r.ended == 0 and r.watermarks == [] and all(c == 0 for c, _ in r.got)
    assert r.got == [(0, 1), (0, 2), (0, 3)] and r.gate.held == set()
    r.drain()
    assert sorted(r.got[3:]) == [(0, 4), (2, 20), (2, 21)] and r.gate.ended == {1} and r.watermarks == [5]


def test_a_restored_gate_declines_an_unaligned_checkpoint_until_every_channel_delivered_its_end() -> None:
    """A priority barrier overtook a sender's recovered data and its EndOfChannelState: the checkpoint is
    declined as not ready (the snapshot would put newer data of another channel before it)."""
    r = restored(2, AlignmentMode.UNALIGNED)
    r.channels[0].send(EndOfChannelState())
    r.channels[0].send(batch(10))
    r.channels[1].send(batch(1))
    r.channels[1].send(EndOfChannelState())
    r.channels[1].send_priority(barrier(1, AlignmentMode.UNALIGNED))
    r.drain()
    assert r.log == [("abort", 1, "TASK_NOT_READY")] and r.got == [(1, 1), (0, 10)]
    r.channels[0].send_priority(barrier(2, AlignmentMode.UNALIGNED))
    r.channels[1].send_priority(barrier(2, AlignmentMode.UNALIGNED))
    r.drain()
    assert r.log[1][:3] == ("snapshot", 2, True) and r.log[-1] == ("finish", 2)


def test_a_gate_not_restored_with_in_flight_data_expects_no_end_of_channel_state() -> None:
    r = Rig(1)
    r.channels[0].send(EndOfChannelState())
    with pytest.raises(RuntimeError, match="EndOfChannelState"):
        r.drain()
