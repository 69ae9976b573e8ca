"""Unit tests of the engine's pieces: key groups, state, channels, barrier handler, graph, config."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest
from sluice import CheckpointConfig, ConfigError, GraphError, Pipeline
from sluice.checkpoint.barriers import CheckpointBarrierTracker, SingleCheckpointBarrierHandler
from sluice.config import ExponentialBackoffRestart, FailureRateRestart, FixedDelayRestart
from sluice.events import AlignmentMode, CheckpointBarrier, CheckpointOptions, EndOfPartition
from sluice.graph import LogicalEdge, LogicalGraph, LogicalNode, NodeKind
from sluice.runtime.channels import LocalChannel, Signal
from sluice.state.api import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from sluice.state.keygroups import (
    hash_values,
    key_group_of,
    key_group_range,
    key_groups,
    subtask_for_key_groups,
)


def batch(n: int = 3) -> pa.RecordBatch:
    return pa.record_batch({"x": list(range(n))})


# -- key groups --------------------------------------------------------------------------------------
def test_hash_is_stable_and_matches_scalar_path() -> None:
    col = pa.array(["a", "b", None, "a"])
    h = hash_values(col)
    assert h[0] == h[3] and h[0] != h[1]
    # fixed values: a change here would break restores of existing checkpoints
    assert key_group_of("a", 128) == int(key_groups(hash_values(pa.array(["a"])), 128)[0]) == 64
    assert [key_group_of(k, 128) for k in (1, 2, 3)] == list(
        key_groups(hash_values(pa.array([1, 2, 3])), 128)
    )


@pytest.mark.parametrize("parallelism", [1, 2, 3, 7, 128])
def test_key_group_ranges_partition_all_groups(parallelism: int) -> None:
    owners = subtask_for_key_groups(np.arange(128), 128, parallelism)
    for i in range(parallelism):
        assert set(np.flatnonzero(owners == i)) == set(key_group_range(128, parallelism, i))


# -- state ---------------------------------------------------------------------------------------------
def test_snapshot_is_copy_on_write(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The job's default keyed backend (hashmap): the synchronous snapshot freezes, later writes copy."""
    from sluice.state.hashmap import HashMapStateBackend
    from sluice.state.transfer import LocalFileTransfer

    files = LocalFileTransfer(str(tmp_path))
    be = HashMapStateBackend().create_keyed_backend("op-0", key_group_range(8, 1, 0), 8, files)
    v, lst, m = (
        be.state(ValueStateDescriptor("v", 0)),
        be.state(ListStateDescriptor("l")),
        be.state(MapStateDescriptor("m")),
    )
    for k in range(20):
        be.set_current_key(k, k % 8)
        v.update(k)
        lst.add(k)
        m.put("a", k)
    snap = be.snapshot(1)
    for k in range(20):
        be.set_current_key(k, k % 8)
        v.update(-1)
        lst.add(99)
        m.put("a", -1)
    handle = snap.run()
    be2 = HashMapStateBackend().create_keyed_backend("op-1", key_group_range(8, 2, 1), 8, files)
    be2.restore([handle])
    be2.set_current_key(13, 5)
    assert be2.state(ValueStateDescriptor("v", 0)).value() == 13
    assert be2.state(ListStateDescriptor("l")).get() == [13]
    assert be2.state(MapStateDescriptor("m")).get("a") == 13
    be2.set_current_key(11, 3)  # key group 3 belongs to the other half: not restored here
    assert be2.state(ValueStateDescriptor("v", 0)).value() == 0


# -- channels ------------------------------------------------------------------------------------------
def test_credit_flow_and_priority_events() -> None:
    sig = Signal()
    ch = LocalChannel(sig, credits=2, output_capacity=2)
    woken = []
    ch.sender_wakeup = lambda: woken.append(1)
    for i in range(4):
        ch.send(batch(i + 1))
    assert not ch.is_available() and ch.queued_output() == 2
    barrier = CheckpointBarrier(1, 0.0, CheckpointOptions(alignment=AlignmentMode.UNALIGNED))
    overtaken = ch.send_priority(barrier)
    assert [b.num_rows for b in overtaken] == [3, 4]
    assert ch.poll() is barrier
    assert [b.num_rows for b in ch.take_overtaken()] == [1, 2]
    got = [ch.poll().num_rows for _ in range(4)]
    assert got == [1, 2, 3, 4] and woken and ch.is_available()


def test_find_barrier_in_output_queue() -> None:
    ch = LocalChannel(Signal(), credits=1, output_capacity=8)
    ch.send(batch(1))
    ch.send(batch(2))
    ch.send(CheckpointBarrier(7, 0.0))
    ch.send(batch(3))
    ahead = ch.find_barrier(7)
    assert ahead is not None and [b.num_rows for b in ahead] == [1, 2]
    first = ch.poll()
    assert isinstance(first, CheckpointBarrier) and first.options.is_unaligned
    assert [ch.poll().num_rows for _ in range(3)] == [1, 2, 3]


# -- barrier handler -----------------------------------------------------------------------------------
class Recorder:
    def __init__(self) -> None:
        self.log: list[tuple] = []
        self.blocked: set[int] = set()

    def block(self, c: int) -> None:
        self.blocked.add(c)

    def unblock_all(self) -> None:
        self.blocked.clear()

    def perform_checkpoint(self, b: CheckpointBarrier, unaligned: bool) -> None:
        self.log.append(("snapshot", b.checkpoint_id, unaligned))

    def start_recording(self, cid: int, chans: set[int], overtaken: dict) -> None:
        self.log.append(("record", cid, sorted(chans)))

    def stop_recording(self, c: int) -> None:
        self.log.append(("stop", c))

    def add_overtaken(self, cid: int, c: int, batches: list) -> None:
        self.log.append(("overtaken", c, len(batches)))

    def finish_recording(self, cid: int) -> None:
        self.log.append(("finish", cid))

    def pull_barrier_forward(self, c: int, cid: int) -> list | None:
        return None

    def recovering(self) -> bool:
        return False

    def abort_checkpoint(self, cid: int, reason: str, failure: object = None) -> None:
        self.log.append(("abort", cid))

    def alignment_done(self, cid: int, s: float, switched: bool) -> None:
        self.log.append(("aligned", cid, switched))


def bar(cid: int) -> CheckpointBarrier:
    return CheckpointBarrier(cid, 0.0)


def test_aligned_blocks_until_last_barrier() -> None:
    r = Recorder()
    h = SingleCheckpointBarrierHandler.aligned(3, r, r)
    h.on_barrier(0, bar(1))
    assert r.blocked == {0} and h.state_name == "CollectingBarriers"
    h.on_barrier(2, bar(1))
    assert r.blocked == {0, 2} and not any(e[0] == "snapshot" for e in r.log)
    h.on_barrier(1, bar(1))
    assert r.blocked == set() and ("snapshot", 1, False) in r.log and h.state_name == "WaitingForFirstBarrier"


def test_end_of_partition_completes_alignment_and_late_barriers_are_ignored() -> None:
    r = Recorder()
    h = SingleCheckpointBarrierHandler.aligned(2, r, r)
    h.on_barrier(0, bar(1))
    h.on_end_of_partition(1)
    assert ("snapshot", 1, False) in r.log
    h.on_barrier(0, bar(1))
    assert sum(1 for e in r.log if e[0] == "snapshot") == 1


def test_newer_barrier_aborts_unfinished_alignment_and_cancel_marker() -> None:
    r = Recorder()
    h = SingleCheckpointBarrierHandler.aligned(2, r, r)
    h.on_barrier(0, bar(1))
    h.on_barrier(1, bar(2))
    assert ("abort", 1) in r.log
    h.on_cancel(0, 2)
    assert ("abort", 2) in r.log and r.blocked == set()


def test_at_least_once_never_blocks() -> None:
    r = Recorder()
    h = CheckpointBarrierTracker(2, r, r)
    h.on_barrier(0, bar(1))
    assert r.blocked == set()
    h.on_barrier(1, bar(1))
    assert ("snapshot", 1, False) in r.log


def test_unaligned_snapshots_at_first_barrier_and_records_others() -> None:
    r = Recorder()
    h = SingleCheckpointBarrierHandler.unaligned(3, r, r)
    h.on_barrier(1, bar(4).as_unaligned())
    assert r.log[0] == ("snapshot", 4, True) and ("record", 4, [0, 2]) in r.log and r.blocked == set()
    h.on_barrier(0, bar(4).as_unaligned())
    h.on_barrier(2, bar(4).as_unaligned())
    assert ("finish", 4) in r.log


def test_randomized_barrier_interleavings_snapshot_each_checkpoint_once() -> None:
    for seed in range(200):
        rng = random.Random(seed)
        n = rng.randint(1, 5)
        r = Recorder()
        h = SingleCheckpointBarrierHandler.aligned(n, r, r)
        for cid in range(1, 6):
            for c in rng.sample(range(n), n):
                h.on_barrier(c, bar(cid))
        assert [e[1] for e in r.log if e[0] == "snapshot"] == [1, 2, 3, 4, 5]


# -- graph and config ---------------------------------------------------------------------------------
def test_cycle_and_unknown_stream_are_refused() -> None:
    g = LogicalGraph()
    g.add(LogicalNode(0, "a", NodeKind.OPERATOR, lambda: None, inputs=[LogicalEdge(1)]))
    g.add(LogicalNode(1, "b", NodeKind.OPERATOR, lambda: None, inputs=[LogicalEdge(0)]))
    g.add(LogicalNode(2, "s", NodeKind.SINK, lambda: None, inputs=[LogicalEdge(1)]))
    with pytest.raises(GraphError, match="cycle"):
        g.validate()
    g2 = LogicalGraph()
    g2.add(LogicalNode(0, "s", NodeKind.SINK, lambda: None, inputs=[LogicalEdge(9)]))
    with pytest.raises(GraphError, match="not part of this pipeline"):
        g2.validate()


def test_parallelism_above_max_and_foreign_streams_are_refused(tmp_path) -> None:
    from sluice.connectors.generator import GeneratorSource
    from sluice.sinks.testing import TwoPhaseCommitTestSink

    p = Pipeline("x", max_parallelism=4)
    p.source(GeneratorSource()).map_batches(lambda b: b, parallelism=8).sink(
        TwoPhaseCommitTestSink(str(tmp_path))
    )
    with pytest.raises(GraphError, match="above max_parallelism 4"):
        p.build()
    other = Pipeline("y").source(GeneratorSource())
    with pytest.raises(GraphError, match="same pipeline"):
        Pipeline("z").source(GeneratorSource()).union(other)
    with pytest.raises(GraphError, match="no sink"):
        Pipeline("w").build()


@pytest.mark.parametrize(
    "kwargs, option",
    [
        ({"interval": 0}, "interval"),
        ({"mode": "exactly"}, "mode"),
        ({"timeout": -1}, "timeout"),
        ({"min_pause": -1}, "min_pause"),
        ({"max_concurrent": 0}, "max_concurrent"),
        ({"tolerable_failed_checkpoints": -1}, "tolerable_failed_checkpoints"),
        ({"num_retained": 0}, "num_retained"),
        ({"storage": "ftp://x"}, "storage"),
        ({"retain_on_cancel": "maybe"}, "retain_on_cancel"),
        ({"unaligned": True, "mode": "at_least_once"}, "mode"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_checkpoint_config_errors_name_the_option(kwargs: dict, option: str) -> None:
    with pytest.raises(ConfigError, match=option):
        CheckpointConfig(**kwargs)
    with pytest.raises(ConfigError, match=option):
        Pipeline("p", checkpoint=kwargs)


def test_mode_error_lists_allowed_values() -> None:
    with pytest.raises(ConfigError, match=r"mode: 'exact' is not allowed \(allowed: 'exactly_once', 'at_least_once'\)"):
        CheckpointConfig(mode="exact")


def test_restart_strategies() -> None:
    class Boom(Exception):
        pass

    calls = []

    def run(strategy) -> None:
        calls.clear()
        with pytest.raises(Boom):
            for attempt in strategy.retrying(Boom):
                with attempt:
                    calls.append(1)
                    raise Boom()

    run(FixedDelayRestart(attempts=3, delay=0))
    assert len(calls) == 4
    run(ExponentialBackoffRestart(initial=0, max_delay=0, max_attempts=2))
    assert len(calls) == 3
    run(FailureRateRestart(max_failures=2, interval=60, delay=0))
    assert len(calls) == 3
    with pytest.raises(ConfigError, match="attempts"):
        FixedDelayRestart(attempts=-1)


def test_end_of_partition_is_an_event() -> None:
    ch = LocalChannel(Signal(), credits=1, output_capacity=1)
    ch.send(batch())
    ch.send(EndOfPartition())  # events need no credit but keep their order
    assert isinstance(ch.poll(), pa.RecordBatch) and isinstance(ch.poll(), EndOfPartition)
