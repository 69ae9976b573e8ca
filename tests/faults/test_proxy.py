"""The fault proxy itself, against a plain TCP echo server: each fault does what it says and is counted."""

from __future__ import annotations

import os
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from typing import Literal

import pytest

from tests.faults.proxy import FaultProxy

WAIT = 30.0  # generous deadline for anything that must happen


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    server = _Server(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield ("127.0.0.1", server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def proxy(echo: tuple[str, int]) -> Iterator[FaultProxy]:
    with FaultProxy(echo) as p:
        yield p


def connect(p: FaultProxy, timeout: float = WAIT) -> socket.socket:
    return socket.create_connection(("127.0.0.1", p.port), timeout=timeout)


def roundtrip(s: socket.socket, data: bytes) -> bytes:
    s.sendall(data)
    got = b""
    while len(got) < len(data):
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def closed_by_peer(s: socket.socket) -> bool:
    """Whether the peer closed or reset the connection (waits up to WAIT for it)."""
    s.settimeout(WAIT)
    try:
        s.sendall(b"x")
        return s.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


def refused(p: FaultProxy) -> bool:
    """Whether a new connection is refused or reset (while connecting or at its first read)."""
    try:
        s = connect(p)
    except (ConnectionRefusedError, ConnectionResetError):
        return True
    with s:
        return closed_by_peer(s)


def wait_for(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_passes_bytes_both_ways_and_counts_them(proxy: FaultProxy) -> None:
    with connect(proxy) as s:
        assert roundtrip(s, b"hello") == b"hello"
        big = os.urandom(3 * 1024 * 1024)
        assert roundtrip(s, big) == big
    assert proxy.stats.accepted == 1 and proxy.stats.forwarded == 1
    assert proxy.stats.bytes_up == proxy.stats.bytes_down == 5 + len(big)
    assert proxy.stats.hit == 0


def test_cut_closes_open_connections_and_refuses_new_ones_until_restored(proxy: FaultProxy) -> None:
    s = connect(proxy)
    assert roundtrip(s, b"a") == b"a"
    proxy.cut()
    assert closed_by_peer(s)
    s.close()
    with pytest.raises(ConnectionRefusedError):  # nothing listens: the kernel refuses, as for a dead server
        connect(proxy)
    assert proxy.stats.cut == 1 and proxy.stats.refused == 0
    proxy.restore()  # listening again on the same port
    with connect(proxy) as again:
        assert roundtrip(again, b"back") == b"back"


def test_reject_closes_open_connections_and_resets_new_ones_counting_them(proxy: FaultProxy) -> None:
    s = connect(proxy)
    assert roundtrip(s, b"a") == b"a"
    proxy.reject()
    assert closed_by_peer(s)
    s.close()
    assert refused(proxy)  # the port still accepts: then resets at once
    assert proxy.stats.cut == 1 and proxy.stats.refused == 1
    proxy.restore()
    with connect(proxy) as again:
        assert roundtrip(again, b"back") == b"back"


def test_reset_aborts_open_connections_with_rst_once(proxy: FaultProxy) -> None:
    s = connect(proxy)
    assert roundtrip(s, b"a") == b"a"
    proxy.reset()
    s.settimeout(WAIT)
    with pytest.raises(ConnectionResetError):
        s.recv(1)  # an RST, not an orderly close (which would return b"")
    s.close()
    assert proxy.stats.reset == 1
    with connect(proxy) as fresh:  # new connections pass
        assert roundtrip(fresh, b"b") == b"b"


def test_blackhole_accepts_but_never_answers_then_lets_held_bytes_through(proxy: FaultProxy) -> None:
    old = connect(proxy)
    assert roundtrip(old, b"a") == b"a"
    proxy.blackhole()
    new = connect(proxy)  # accepted: the handshake completes
    for s in (old, new):
        s.sendall(b"held")
        s.settimeout(0.3)
        with pytest.raises(TimeoutError):
            s.recv(4)  # nothing comes back (however slow the machine: a blackhole never answers)
    assert proxy.stats.held == 2
    proxy.restore()
    for s in (old, new):
        s.settimeout(WAIT)
        got = b""
        while len(got) < 4:
            got += s.recv(4)
        assert got == b"held"  # TCP would retransmit: nothing sent in the outage is lost
        s.close()


def test_delay_adds_latency_to_every_chunk_without_reordering(proxy: FaultProxy) -> None:
    proxy.delay(0.2)
    with connect(proxy) as s:
        start = time.monotonic()
        assert roundtrip(s, b"slow") == b"slow"
        assert time.monotonic() - start >= 0.4  # a lower bound: each way waits its delay
        data = os.urandom(1024 * 1024)
        assert roundtrip(s, data) == data
    proxy.restore()


def test_unreachable_upstream_closes_the_client_and_is_counted() -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with FaultProxy(("127.0.0.1", port)) as p:
        try:
            s = connect(p)
        except ConnectionResetError:
            pass  # the proxy's reset came before a loaded machine returned from connect(): closed all the same
        else:
            with s:
                assert closed_by_peer(s)
        wait_for(lambda: p.stats.upstream_failed == 1, "the failed upstream to be counted")


@pytest.mark.parametrize("kind", ["cut", "reject"])
def test_outage_for_ends_by_itself(proxy: FaultProxy, kind: Literal["cut", "reject"]) -> None:
    before = proxy.outage_for(0.2, kind)
    assert proxy.mode == kind
    assert refused(proxy)
    wait_for(lambda: proxy.mode == "pass", "the outage to end")
    assert proxy.stats.since(before).refused == (1 if kind == "reject" else 0)
    with connect(proxy) as s:
        assert roundtrip(s, b"ok") == b"ok"


def test_fault_block_reports_what_it_hit(proxy: FaultProxy) -> None:
    s = connect(proxy)
    assert roundtrip(s, b"a") == b"a"
    with proxy.fault("cut") as hit:
        assert closed_by_peer(s)
    s.close()
    assert hit.cut == 1 and hit.hit == 1
    assert proxy.mode == "pass"


def test_stop_closes_everything_and_is_idempotent(echo: tuple[str, int]) -> None:
    p = FaultProxy(echo).start()
    s = connect(p)
    assert roundtrip(s, b"a") == b"a"
    p.blackhole()
    held = connect(p)
    wait_for(lambda: p.stats.held == 2, "the proxy to hold the new connection")
    p.stop()
    p.stop()
    assert closed_by_peer(s)
    assert closed_by_peer(held)
    s.close()
    held.close()


def test_stall_check_reads_values_not_field_names() -> None:
    """A status that merely has a ``stalled`` field (None, empty) does not count as showing a stall."""
    from tests.faults.contract import _stalled

    assert not _stalled({"vertices": [{"totals": {"stalled": None}}], "stalled_sources": []})
    assert _stalled({"stalled_sources": [{"source": "kafka", "since": 1.0, "reason": "no broker"}]})
    assert _stalled({"vertices": [{"subtasks": [{"stalled": {"since": 1.0}}]}]})
