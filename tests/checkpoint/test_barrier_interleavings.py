"""Randomized interleavings at a task's input, against a model of what each checkpoint must contain.

Like Flink's ``AlignedCheckpointsMassiveRandomTest``: real :class:`LocalChannel` queues (credits, priority
events, barrier pull-forward) feed a :class:`BarrierHandler` whose target records every call and plays the
task's part (poll unblocked channels, process data, record channel state). Upstream senders interleave
data, barriers (in order, priority, or announced), cancel markers and end of partition; the coordinator
aborts checkpoints; the clock jumps so that adaptive timeouts fire at random moments.

The model, for every checkpoint n that completes here: operator state (the data processed before the
snapshot) + recorded channel state + the senders' output state (what their priority barrier overtook)
equals exactly the data sent before barrier n on every channel (all of a channel's data if it ended without
barrier n). At-least-once may include later data but misses none. Besides: the handler aborts only for a
reason (a cancel marker, a coordinator abort, a newer barrier), never leaves a channel blocked or a
recording open between checkpoints, and every checkpoint ends one way or the other.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pytest
from sluice.checkpoint.barriers import SingleCheckpointBarrierHandler, barrier_handler
from sluice.events import (
    AlignmentMode,
    CancelCheckpointMarker,
    CheckpointAnnouncement,
    CheckpointBarrier,
    CheckpointKind,
    CheckpointOptions,
    EndOfPartition,
)
from sluice.runtime.channels import LocalChannel, Signal

Item = tuple[int, int]  # (channel, sequence number): one data batch

_BATCHES: dict[Item, pa.RecordBatch] = {}
_ITEMS: dict[int, Item] = {}


def data(channel: int, seq: int) -> pa.RecordBatch:
    batch = _BATCHES.get((channel, seq))
    if batch is None:
        batch = _BATCHES[(channel, seq)] = pa.record_batch({"c": [channel], "i": [seq]})
        _ITEMS[id(batch)] = (channel, seq)
    return batch


def items(batches: list[Any]) -> list[Item]:
    return [_ITEMS[id(b)] for b in batches]


@dataclass
class Sender:
    """The upstream end of one channel: what it sent, and where each barrier went in its sequence."""

    channel: LocalChannel
    sent: list[Item] = field(default_factory=list)
    at_barrier: dict[int, int] = field(default_factory=dict)
    output_state: dict[int, list[Item]] = field(default_factory=dict)
    todo: deque[tuple[str, CheckpointBarrier, bool]] = field(default_factory=deque)
    ended: bool = False


class Task:
    """Both halves the handler acts on (input, checkpointing), and the part of a task around them: polls
    unblocked channels."""

    def __init__(self, rng: random.Random, n: int, mode: AlignmentMode, credits: int) -> None:
        self.rng = rng
        self.mode = mode
        self.now = 1000.0
        signal = Signal()
        self.senders = [Sender(LocalChannel(signal, credits=credits, output_capacity=credits)) for _ in range(n)]
        self.handler = barrier_handler(mode, n, self, self, clock=lambda: self.now)
        self.processed: list[Item] = []
        self.blocked: set[int] = set()
        self.ended: set[int] = set()
        self.snapshots: dict[int, list[Item]] = {}
        self.unaligned: dict[int, bool] = {}
        self.kinds: dict[int, CheckpointBarrier] = {}
        self.channel_state: dict[int, list[Item]] = {}
        self.recording: tuple[int, set[int]] | None = None
        self.finished: set[int] = set()
        self.aborted: set[int] = set()
        self.switched: dict[int, bool] = {}
        self.events: list[tuple[str, int]] = []  # what the handler was told, with the checkpoint id
        self.event: tuple[str, int] = ("", 0)

    # -- the input and checkpointing halves ---------------------------------------------------------------------------------
    def block(self, channel: int) -> None:
        assert channel not in self.ended
        self.blocked.add(channel)

    def unblock_all(self) -> None:
        self.blocked.clear()

    def perform_checkpoint(self, barrier: CheckpointBarrier, unaligned: bool) -> None:
        cid = barrier.checkpoint_id
        assert cid not in self.snapshots, f"checkpoint {cid} snapshotted twice"
        assert not self.snapshots or cid > max(self.snapshots), "snapshots go forward"
        if self.event[0] == "timeout":
            timeout = barrier.options.alignment_timeout or 0.0
            assert unaligned and self.now - barrier.timestamp >= timeout, "switched before the timeout"
        self.snapshots[cid] = list(self.processed)
        self.unaligned[cid] = unaligned
        self.kinds[cid] = barrier

    def start_recording(self, checkpoint_id: int, channels: set[int], overtaken: dict[int, list[Any]]) -> None:
        assert self.unaligned.get(checkpoint_id), "channel state only for an unaligned snapshot"
        assert self.recording is None
        self.channel_state[checkpoint_id] = [x for c in sorted(overtaken) for x in items(overtaken[c])]
        self.recording = (checkpoint_id, set(channels))

    def stop_recording(self, channel: int) -> None:
        if self.recording is not None:
            self.recording[1].discard(channel)

    def add_overtaken(self, checkpoint_id: int, channel: int, batches: list[Any]) -> None:
        assert self.recording is not None and self.recording[0] == checkpoint_id
        self.channel_state[checkpoint_id].extend(items(batches))

    def finish_recording(self, checkpoint_id: int) -> None:
        assert self.recording is not None and self.recording[0] == checkpoint_id and not self.recording[1]
        self.recording = None
        self.finished.add(checkpoint_id)

    def pull_barrier_forward(self, channel: int, checkpoint_id: int) -> list[Any] | None:
        return self.senders[channel].channel.find_barrier(checkpoint_id)

    def recovering(self) -> bool:
        return False  # restores are tests/runtime/test_input_gate.py's and tests/faults/test_rescale_order.py's

    def abort_checkpoint(self, checkpoint_id: int, reason: str, failure: Any = None) -> None:
        kind, m = self.event
        legit = (kind == "barrier" and m > checkpoint_id) or (kind in ("cancel", "aborted") and m >= checkpoint_id)
        assert legit, f"checkpoint {checkpoint_id} aborted ({reason}) while handling {kind} {m}"
        assert checkpoint_id not in self.finished, f"checkpoint {checkpoint_id} aborted after it finished here"
        if self.recording is not None and self.recording[0] == checkpoint_id:
            self.recording = None
        self.aborted.add(checkpoint_id)

    def alignment_done(self, checkpoint_id: int, alignment_s: float, switched: bool) -> None:
        assert checkpoint_id in self.snapshots and checkpoint_id not in self.switched
        self.switched[checkpoint_id] = switched
        if not self.unaligned[checkpoint_id]:
            self.finished.add(checkpoint_id)

    # -- the handler's events ----------------------------------------------------------------------------
    def tell(self, kind: str, cid: int, call: Any, *args: Any) -> None:
        self.event = (kind, cid)
        self.events.append(self.event)
        call(*args)
        self.check_between_events()

    def check_between_events(self) -> None:
        h = self.handler
        if isinstance(h, SingleCheckpointBarrierHandler):
            assert (h.current is None) == (h.state_name == type(h.waiting).__name__), h.state_name
            if h.current is None:
                assert self.recording is None, "a recording outlived its checkpoint"
        if not h.in_progress:
            assert not self.blocked, f"channels {self.blocked} stay blocked between checkpoints"

    def poll(self) -> bool:
        ready = [
            c
            for c, s in enumerate(self.senders)
            if c not in self.blocked and c not in self.ended and s.channel.has_input()
        ]
        if not ready:
            return False
        c = self.rng.choice(ready)
        item = self.senders[c].channel.poll()
        if isinstance(item, pa.RecordBatch):
            if self.recording is not None and c in self.recording[1]:
                self.channel_state[self.recording[0]].append(_ITEMS[id(item)])
            self.processed.append(_ITEMS[id(item)])
        elif isinstance(item, CheckpointBarrier):
            overtaken = self.senders[c].channel.take_overtaken() if item.options.is_unaligned else None
            self.tell("barrier", item.checkpoint_id, self.handler.on_barrier, c, item, overtaken)
        elif isinstance(item, CheckpointAnnouncement):
            self.tell("announcement", item.barrier.checkpoint_id, self.handler.on_announcement, c, item.barrier)
        elif isinstance(item, CancelCheckpointMarker):
            cid, cur = item.checkpoint_id, self.handler.current
            open_ = cid > self.handler.last_done and (cur is None or cid >= cur.checkpoint_id)
            self.tell("cancel", cid, self.handler.on_cancel, c, cid)
            # the task must hear of it: it tells its downstream tasks and the coordinator
            assert not open_ or cid in self.aborted, f"cancel marker of checkpoint {cid} ignored"
        elif isinstance(item, EndOfPartition):
            self.ended.add(c)
            self.blocked.discard(c)
            self.tell("end", 0, self.handler.on_end_of_partition, c)
        return True

    # -- upstream --------------------------------------------------------------------------------------
    def send_data(self, c: int) -> None:
        s = self.senders[c]
        s.sent.append((c, len(s.sent)))
        s.channel.send(data(c, len(s.sent) - 1))

    def send_next(self, c: int) -> None:
        s = self.senders[c]
        what, b, priority = s.todo.popleft()
        cid = b.checkpoint_id
        if what == "cancel":
            s.channel.send(CancelCheckpointMarker(cid))
            return
        s.at_barrier[cid] = len(s.sent)
        if priority:  # an unaligned barrier: what it overtakes in the output queue is the sender's state
            s.output_state[cid] = items(s.channel.send_priority(b.as_unaligned()))
        else:
            if b.options.alignment is AlignmentMode.ADAPTIVE:
                s.channel.send_priority(CheckpointAnnouncement(b))
            s.channel.send(b)

    def end(self, c: int) -> None:
        s = self.senders[c]
        s.todo.clear()  # the upstream task finished before these checkpoints reached it
        s.ended = True
        s.channel.send(EndOfPartition())

    # -- the model -------------------------------------------------------------------------------------
    def expected(self, cid: int) -> list[Item]:
        out: list[Item] = []
        for c, s in enumerate(self.senders):
            if cid in s.at_barrier:
                out += s.sent[: s.at_barrier[cid]]
            else:
                assert c in self.ended, f"checkpoint {cid} completed without a barrier from live channel {c}"
                out += s.sent
        return out

    def check_completed(self) -> int:
        done = self.finished - self.aborted
        for cid in sorted(done):
            b = self.kinds[cid]
            savepoint = b.options.kind is CheckpointKind.SAVEPOINT
            got = Counter(self.snapshots[cid])
            got.update(self.channel_state.get(cid, []))
            for s in self.senders:
                got.update(s.output_state.get(cid, []))
            want = Counter(self.expected(cid))
            if self.mode is AlignmentMode.AT_LEAST_ONCE and not savepoint:
                assert not self.channel_state.get(cid) and max(got.values(), default=1) == 1
                assert not want - got, f"at-least-once checkpoint {cid} misses {sorted(want - got)}"
            else:
                assert got == want, (
                    f"checkpoint {cid}: missing {sorted(want - got)}, extra or twice {sorted(got - want)}"
                )
            unaligned = self.unaligned[cid]
            if savepoint or self.mode in (AlignmentMode.ALIGNED, AlignmentMode.AT_LEAST_ONCE):
                assert not unaligned, f"checkpoint {cid} must be aligned"
            elif self.mode is AlignmentMode.UNALIGNED:
                assert unaligned and not self.switched[cid]
            else:
                assert self.switched[cid] == unaligned
        return len(done)


def options(rng: random.Random, mode: AlignmentMode) -> CheckpointOptions:
    if rng.random() < 0.15:
        return CheckpointOptions(CheckpointKind.SAVEPOINT, AlignmentMode.ALIGNED)
    timeout = rng.choice([0.0, 1.0, 3.0, 10.0, 1e9]) if mode is AlignmentMode.ADAPTIVE else None
    return CheckpointOptions(alignment=mode, alignment_timeout=timeout)


def run(seed: int, mode: AlignmentMode, chaos: bool) -> tuple[int, int]:
    """One random interleaving; returns (checkpoints triggered, checkpoints completed here)."""
    rng = random.Random(seed)
    n = rng.randint(2, 5)
    t = Task(rng, n, mode, credits=rng.randint(1, 3))
    next_id = 1
    for _ in range(rng.randint(40, 200)):
        live = [c for c, s in enumerate(t.senders) if not s.ended]
        r = rng.random()
        if r < 0.3 and live:
            t.send_data(rng.choice(live))
        elif r < 0.6:
            t.poll()
        elif r < 0.72:
            pending = [c for c in live if t.senders[c].todo]
            if pending:
                t.send_next(rng.choice(pending))
        elif r < 0.8 and live:
            in_flight = next_id - 1 - t.handler.last_done
            if in_flight < (3 if chaos else 1):  # without chaos, like max_concurrent=1
                b = CheckpointBarrier(next_id, t.now, options(rng, mode))
                next_id += 1
                for c in live:
                    plan(rng, t.senders[c], b, mode, chaos)
        elif r < 0.92:
            t.now += rng.choice([0.0, 0.5, 1.0, 4.0])
            t.tell("timeout", 0, t.handler.check_timeout)
        elif r < 0.95 and chaos and next_id > 1:
            cid = rng.randrange(1, next_id)
            t.tell("aborted", cid, t.handler.on_aborted, cid)
        elif r < 0.97 and live:
            t.end(rng.choice(live))
    # every sender flushes what it still has to send; then nothing may hang
    for c, s in enumerate(t.senders):
        while s.todo:
            t.send_next(c)
    while t.poll():
        pass
    assert not t.handler.in_progress, f"{t.handler.state_name}: stuck with every barrier delivered"
    for c, s in enumerate(t.senders):
        if not s.ended:
            t.end(c)
    while t.poll():
        pass
    assert not any(s.channel.has_input() or s.channel.queued_output() for s in t.senders)
    assert t.recording is None and not t.blocked
    completed = t.check_completed()
    sent_any = {cid for s in t.senders for cid in s.at_barrier}
    for cid in sorted(sent_any - t.finished):
        assert chaos, f"checkpoint {cid} did not complete in a run without cancellations or aborts"
        assert any((k == "barrier" and m > cid) or (k in ("cancel", "aborted") and m >= cid) for k, m in t.events), (
            f"checkpoint {cid} neither completed nor was aborted for a reason"
        )
    return next_id - 1, completed


def plan(rng: random.Random, s: Sender, b: CheckpointBarrier, mode: AlignmentMode, chaos: bool) -> None:
    """What the upstream task of one channel will send for checkpoint ``b``."""
    savepoint = b.options.kind is CheckpointKind.SAVEPOINT
    # unaligned barriers overtake; in adaptive mode an upstream task may have switched already
    priority = not savepoint and (
        mode is AlignmentMode.UNALIGNED or (mode is AlignmentMode.ADAPTIVE and rng.random() < 0.25)
    )
    r = rng.random() if chaos else 1.0
    if r < 0.08:
        s.todo.append(("cancel", b, False))  # the upstream task aborted it before its snapshot
        return
    s.todo.append(("barrier", b, priority))
    if r < 0.15:
        s.todo.append(("cancel", b, False))  # ... or after


MODES = [AlignmentMode.ALIGNED, AlignmentMode.AT_LEAST_ONCE, AlignmentMode.UNALIGNED, AlignmentMode.ADAPTIVE]


@pytest.mark.parametrize("chaos", [False, True], ids=["clean", "chaos"])
@pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])
def test_random_interleavings_snapshot_exactly_what_precedes_the_barriers(mode: AlignmentMode, chaos: bool) -> None:
    triggered = completed = 0
    for seed in range(2000):
        try:
            t, c = run(seed, mode, chaos)
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}: {exc}") from exc
        triggered += t
        completed += c
    # the interleavings are not degenerate: most checkpoints get through
    assert completed > triggered * (0.2 if chaos else 0.8), (completed, triggered)
