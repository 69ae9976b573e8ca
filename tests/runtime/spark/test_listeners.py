"""No idle peer stalls a job on the Spark runtime: whenever a listener comes up (the driver's control
server, and each slot's data plane as the driver learns its address, before the other slots do), a hook
holds more connections to it open than the cap on unauthenticated connections, and sends nothing. The job
still starts, its slots reach the driver and each other, and its committed output equals a failure-free
in-process run's; the same holds for the listeners of an attempt that restarts after a slot crash.

Before: the listeners ran one 10 s handshake after the other in one accept thread, so 14 idle connections
on the driver's listener kept the slots out until the attempt timed out, and the restarted attempt's
listener was flooded the same way."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Any

import pytest
from sluice.runtime.fault_hook import FaultHook
from sluice.runtime.spark.listener import max_pending
from sluice.testing.spark_faults import SlotCrash, SparkFaultInjector

from tests.faults.shapes import record
from tests.runtime.spark.runner import reference, run_shape_on, shape_named

pytestmark = [pytest.mark.spark, pytest.mark.faults]

#: idle connections per listener: more than the cap of any listener of a job of up to 4 slots
IDLE = max_pending(4) + 8


class IdleFlood:
    """A fault hook: at each listener that comes up it opens IDLE connections that never say a word; the
    rest (slot crashes) it leaves to ``inner``."""

    def __init__(self, inner: FaultHook) -> None:
        self.inner = inner
        self.flooded: list[str] = []
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def hit(self, point: str, where: str = "") -> None:
        if point == "listening":
            host, port = where.rsplit(" ", 1)[1].rsplit(":", 1)
            opened = [socket.create_connection((host, int(port)), timeout=30) for _ in range(IDLE)]
            with self._lock:
                self.flooded.append(where)
                self._sockets += opened
        self.inner.hit(point, where)

    def for_attempt(self, attempt: int) -> FaultHook | None:
        return self.inner.for_attempt(attempt)

    def in_slot(self, slot: int, report: Callable[[str], None]) -> FaultHook | None:
        return self.inner.in_slot(slot, report)

    def record(self, description: str) -> None:
        self.inner.record(description)

    def close(self) -> None:
        with self._lock:
            for s in self._sockets:
                s.close()


@pytest.mark.parametrize(("shape", "seed", "crashes"), [("keyed", 2, []), ("keyed", 7, [SlotCrash("process", 10)])],
                         ids=["start", "restart"])
def test_idle_connections_to_every_listener_do_not_stall_the_job(
    spark: Any, shape: str, seed: int, crashes: list[SlotCrash]
) -> None:
    expected = reference(shape, seed)
    assert expected, "the failure-free run committed nothing"
    crash = SparkFaultInjector(crashes)
    flood = IdleFlood(crash)
    try:
        got, result = run_shape_on("spark", shape_named(shape), seed, flood)
    finally:
        flood.close()
    fired = bool(flood.flooded) and len(crash.fired) == len(crashes)
    record("spark-listeners", f"{shape}-{seed}", shape, "aligned", fired, len(crash.fired), got, expected)
    assert len(crash.fired) == len(crashes), crash.fired
    assert result.attempts == len(crashes) + 1, result.failures  # no attempt was lost to the flood
    drivers = [w for w in flood.flooded if w.startswith("driver control")]
    planes = [w for w in flood.flooded if " data plane " in w]
    assert len(drivers) == result.attempts and len(planes) >= 2 * result.attempts, flood.flooded
    assert got == list(expected), "committed output differs"


def test_a_listener_closed_before_its_thread_runs_ends_quietly(monkeypatch: pytest.MonkeyPatch) -> None:
    """close() may come before the accept thread first runs (a job torn down while it starts): that thread
    must end, not die on the closed socket (it raised EBADF from settimeout)."""
    from sluice.runtime.spark.listener import Listener

    died: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))
    server = socket.create_server(("127.0.0.1", 0))
    listener = Listener(server, b"secret", None, lambda sock, addr: None, "early-close")
    listener.close()
    listener.start()
    listener._thread.join(5.0)
    assert not listener._thread.is_alive() and died == []
