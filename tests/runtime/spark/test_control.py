"""The driver's control server and the attempt's failure bookkeeping, without Spark: slots are real
authenticated connections from this process.

Root cause first: a failure a slot reports outranks a slot connection that ends without a goodbye, which
outranks a failure the slot marks as a consequence; the first failure of the best rank is the root cause
and the others are attached to it.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sluice import CheckpointConfig, Pipeline
from sluice.checkpoint.storage_loader import checkpoint_storage
from sluice.connectors.generator import GeneratorSource
from sluice.graph import SubtaskId
from sluice.runtime.attempt import AttemptCancelled, FailureKind, JobAttempt
from sluice.runtime.spark import messages as m
from sluice.runtime.spark import rpc
from sluice.runtime.spark.control import ControlServer, SlotLostError
from sluice.runtime.spark.listener import max_pending
from sluice.sinks.testing import TwoPhaseCommitTestSink

pytestmark = pytest.mark.spark

SECRET = b"k" * 32
T0, T1 = SubtaskId(0, 0), SubtaskId(0, 1)


def new_attempt(tmp_path: Path, attempt: int = 2) -> JobAttempt:
    p = Pipeline("control", checkpoint=CheckpointConfig(interval=1.0, storage=str(tmp_path / "chk")))
    p.source(GeneratorSource(num_splits=2), parallelism=2).sink(TwoPhaseCommitTestSink(str(tmp_path / "out")))
    cfg = p.job_config(restore="none")
    return JobAttempt(p.build(), cfg, checkpoint_storage(cfg.checkpoint.storage, cfg.job_id), attempt, None)


class FakeSlot:
    """A slot's control connection, driven by the test."""

    def __init__(self, server: ControlServer, index: int, attempt: int) -> None:
        self.index = index
        self.attempt = attempt
        self.received: list[m.Message] = []
        self.got = threading.Event()
        sock = rpc.connect("127.0.0.1", server.port, SECRET, None)
        self.conn = rpc.MessageConnection(sock, self._on_message, lambda error: None, f"fake-slot-{index}")
        self.conn.start()

    def _on_message(self, msg: m.Message) -> None:
        self.received.append(msg)
        self.got.set()

    def hello(self) -> FakeSlot:
        self.conn.send(m.Hello(self.attempt, self.index, 1, ("127.0.0.1", 7000 + self.index)))
        return self

    def send(self, make: Callable[[int], m.SlotMessage]) -> None:
        self.conn.send(make(self.attempt))

    def end(self, goodbye: bool) -> None:
        if goodbye:
            self.conn.send(m.Goodbye(self.attempt, self.index))
        self.conn.close(flush_timeout=5.0)


def rendezvous(*slots: FakeSlot) -> None:
    """Wait until the driver handled every slot's Hello: it sends each the peers' addresses. A real slot
    reports nothing before (it builds its subtasks once it knows its peers), so its connection is one the
    driver waits for in ``wait_closed``; without this, a connection the driver had not yet set up could
    deliver its reports after ``wait_closed`` returned, however the driver ranks failures."""
    for s in slots:
        assert s.got.wait(10) and isinstance(s.received[0], m.Peers), f"slot {s.index} got no peers"


@pytest.fixture
def control(tmp_path: Path) -> Iterator[tuple[JobAttempt, ControlServer]]:
    a = new_attempt(tmp_path)
    server = ControlServer(a, 2, SECRET, None, "127.0.0.1")
    yield a, server
    server.close()


def test_a_reported_error_is_the_root_cause_though_a_loss_was_seen_first(
    control: tuple[JobAttempt, ControlServer],
) -> None:
    a, server = control
    s0, s1 = FakeSlot(server, 0, a.attempt).hello(), FakeSlot(server, 1, a.attempt).hello()
    rendezvous(s0, s1)
    s1.end(goodbye=False)  # Spark killed slot 1 after slot 0 failed; its loss reaches the driver first
    assert a.done.wait(10) and isinstance(a.failure, SlotLostError)
    server.end(m.Cancel())
    s0.send(lambda n: m.TaskFailed(n, T0, ValueError("bad row")))
    s0.end(goodbye=True)
    assert server.wait_closed(10), "a slot connection did not end"
    assert isinstance(a.failure, ValueError) and a.failed_task == T0
    assert [type(e) for e in a.secondary_failures] == [SlotLostError]
    assert a.failure_text().startswith("ValueError: bad row; also failed: SlotLostError: slot 1 lost")


def test_a_loss_outranks_the_consequences_it_caused(control: tuple[JobAttempt, ControlServer]) -> None:
    a, server = control
    s0, s1 = FakeSlot(server, 0, a.attempt).hello(), FakeSlot(server, 1, a.attempt).hello()
    rendezvous(s0, s1)
    s1.send(lambda n: m.SlotFailed(n, 1, ConnectionError("slot 1 lost its link to slot 0"), True))
    s1.end(goodbye=True)
    s0.end(goodbye=False)  # slot 0's process died: no report, no goodbye
    assert server.wait_closed(10)
    assert isinstance(a.failure, SlotLostError) and "slot 0" in str(a.failure)
    assert [str(e) for e in a.secondary_failures] == ["slot 1 lost its link to slot 0"]


def test_a_slot_that_says_goodbye_did_not_fail(control: tuple[JobAttempt, ControlServer]) -> None:
    a, server = control
    s0, s1 = FakeSlot(server, 0, a.attempt).hello(), FakeSlot(server, 1, a.attempt).hello()
    rendezvous(s0, s1)
    s0.send(lambda n: m.Registered(n, 0, ((T0, "source (1/2)"),)))
    s0.end(goodbye=True)
    s1.end(goodbye=True)
    assert server.wait_closed(10)
    assert a.failure is None and not a.done.is_set() and not server.all_registered.is_set()


def test_stale_attempts_are_ignored_and_late_slots_told_the_end(
    control: tuple[JobAttempt, ControlServer],
) -> None:
    a, server = control
    zombie = FakeSlot(server, 0, a.attempt - 1).hello()
    zombie.send(lambda n: m.TaskFailed(n, T0, ValueError("from the previous attempt")))
    server.end(m.Stop())
    late = FakeSlot(server, 1, a.attempt).hello()
    assert late.got.wait(10) and late.received == [m.Stop()]
    late.end(goodbye=True)
    zombie.end(goodbye=False)
    assert server.wait_closed(10)
    assert a.failure is None, a.failure


def test_slots_the_driver_kills_are_not_failures(control: tuple[JobAttempt, ControlServer]) -> None:
    a, server = control
    s0 = FakeSlot(server, 0, a.attempt).hello()
    s0.send(lambda n: m.Registered(n, 0, ()))
    server.end(m.Cancel())
    assert s0.got.wait(10) and s0.received == [m.Cancel()]
    server.killing()
    s0.end(goodbye=False)
    assert server.wait_closed(10)
    assert a.failure is None


def test_ranking_and_a_failure_the_runtime_set(tmp_path: Path) -> None:
    a = new_attempt(tmp_path)
    stage, lost, error = RuntimeError("stage failed"), SlotLostError("slot 1 lost"), ValueError("x")
    a.failed(None, stage, FailureKind.CONSEQUENCE)
    assert a.failure is stage and a.done.is_set()
    a.failed(None, lost, FailureKind.LOST)
    assert a.failure is lost and a.secondary_failures == [stage]
    a.failed(T1, error)
    late = ValueError("a later report")
    a.failed(T0, late)
    assert (a.failure, a.failed_task) == (error, T1)
    assert a.secondary_failures == [stage, lost, late]  # in the order they arrived
    b = new_attempt(tmp_path)
    b.failure = AttemptCancelled("cancelled")
    b.failed(T0, error)
    assert isinstance(b.failure, AttemptCancelled) and b.secondary_failures == [error]


def test_slots_learn_their_peers_once_every_slot_said_hello(
    control: tuple[JobAttempt, ControlServer],
) -> None:
    a, server = control
    s1 = FakeSlot(server, 1, a.attempt).hello()
    assert not s1.got.wait(0.2), "the driver sent something before every slot said hello"
    s0 = FakeSlot(server, 0, a.attempt).hello()
    expected = m.Peers((("127.0.0.1", 7000), ("127.0.0.1", 7001)))
    assert s0.got.wait(10) and s1.got.wait(10)
    assert s0.received == [expected] and s1.received == [expected]
    late = FakeSlot(server, 1, a.attempt).hello()  # a slot that connects again gets the addresses alone
    assert late.got.wait(10) and late.received == [expected] and s0.received == [expected]


def test_idle_connections_do_not_keep_slots_from_the_driver(control: tuple[JobAttempt, ControlServer]) -> None:
    """More idle connections than the cap, held on the driver's listener before the slots connect, keep
    none of them out. Before: one 10 s handshake after the other, and the slots timed out."""
    a, server = control
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=60) for _ in range(max_pending(2) + 8)]
    try:
        s0, s1 = FakeSlot(server, 0, a.attempt).hello(), FakeSlot(server, 1, a.attempt).hello()
        assert s0.got.wait(60) and s1.got.wait(60)
        assert isinstance(s0.received[0], m.Peers) and s0.received == s1.received
        s0.end(goodbye=True)
        s1.end(goodbye=True)
        assert server.wait_closed(60) and a.failure is None
    finally:
        for s in idle:
            s.close()
