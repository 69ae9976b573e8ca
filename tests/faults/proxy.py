"""A TCP fault proxy on loopback: the network faults of the fault tier (cut, reject, reset, blackhole, delay).

It sits between sluice and a server it talks to (the tansu broker, moto's S3 server) and forwards bytes both
ways until a test switches a fault on:

* ``cut()``: the proxy stops listening and closes every open connection: new connections are refused by
  the kernel (ECONNREFUSED), as when the server's process is gone. ``restore()`` listens on the same port
  again. Only the connections it closed are counted (``cut``): refused ones never reach the proxy.
* ``reject()``: an outage the proxy can count: open connections are closed, and every new one is accepted
  and reset at once (``refused``) until ``restore()``.
* ``reset()``: every open connection is aborted with a TCP RST (SO_LINGER 0) to both ends, once; new
  connections pass.
* ``blackhole()``: connections are accepted but nothing is answered: open ones stop forwarding (bytes stay
  in the socket buffers, so TCP's flow control stalls the sender, as over a partitioned network) and new ones
  wait before connecting upstream. ``restore()`` lets the held bytes through, as TCP's retransmissions would.
* ``delay(s)``: every chunk is forwarded ``s`` seconds after it was read (latency, not a rate limit).

Written with asyncio (standard library; no binary to install, unlike Toxiproxy, and in-process, so a test
reads its counters directly): one event loop in a daemon thread; the public methods are thread-safe and
return once the fault is in place. :attr:`FaultProxy.stats` counts what each fault did, so a scenario can
tell a fault that fired (a client was cut, refused or held) from one that hit nobody.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any, Literal, TypeVar

__all__ = ["FaultProxy", "ProxyStats"]

T = TypeVar("T")
Mode = Literal["pass", "cut", "reject", "blackhole"]
Outage = Literal["cut", "reject", "blackhole"]
_CHUNK = 64 * 1024


@dataclass
class ProxyStats:
    """What went through the proxy and what its faults did (counted since it started)."""

    accepted: int = 0  # connections accepted from clients
    forwarded: int = 0  # of those, connected upstream
    cut: int = 0  # open connections closed by cut() or reject()
    refused: int = 0  # connections accepted and reset at once by reject()
    reset: int = 0  # open connections aborted by reset()
    held: int = 0  # connections stalled by a blackhole (open at blackhole() or accepted during it)
    upstream_failed: int = 0  # connections whose upstream could not be reached
    bytes_up: int = 0  # client -> server
    bytes_down: int = 0  # server -> client

    def copy(self) -> ProxyStats:
        return ProxyStats(**{f.name: getattr(self, f.name) for f in fields(self)})

    def since(self, earlier: ProxyStats) -> ProxyStats:
        """The counts between ``earlier`` (a :meth:`copy`) and now."""
        return ProxyStats(**{f.name: getattr(self, f.name) - getattr(earlier, f.name) for f in fields(self)})

    @property
    def hit(self) -> int:
        """Connections a fault acted on: cut, refused, reset or held."""
        return self.cut + self.refused + self.reset + self.held


def _rst(writer: asyncio.StreamWriter) -> None:
    """Abort the connection with a TCP RST (SO_LINGER 0), not a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


class _Conn:
    """One proxied connection: the client's and the upstream's streams, and the tasks pumping between them."""

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.tasks: list[asyncio.Task[None]] = []

    def writers(self) -> list[asyncio.StreamWriter]:
        return [w for w in (self.client, self.upstream) if w is not None]

    def close(self, rst: bool) -> None:
        for t in self.tasks:
            t.cancel()
        for w in self.writers():
            if rst:
                _rst(w)
            else:
                w.close()


class FaultProxy:
    """Forwards ``127.0.0.1:<port>`` to ``upstream`` with switchable faults (see the module docstring).

    Args:
        upstream: ``(host, port)`` to forward to; may be set later with :meth:`set_upstream` (a broker
            that must advertise the proxy's port is started after the proxy).
        port: the port to listen on (0: a free one).
    """

    def __init__(self, upstream: tuple[str, int] | None = None, port: int = 0) -> None:
        self.upstream = upstream
        self.stats = ProxyStats()
        self._port = port
        self._mode: Mode = "pass"
        self._delay = 0.0
        self._conns: set[_Conn] = set()
        self._open = asyncio.Event()  # set while not blackholed
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> FaultProxy:
        """Bind and serve in a background thread; returns once the port accepts connections."""
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        def serve() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            self._open = asyncio.Event()
            self._open.set()
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._handle, "127.0.0.1", self._port, reuse_address=True)
            )
            self._port = self._server.sockets[0].getsockname()[1]
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, name=f"fault-proxy-{self._port}", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the fault proxy did not start listening within 10 s")
        return self

    def stop(self) -> None:
        """Close every connection and the listener; stop the loop (idempotent)."""
        loop, self._loop = self._loop, None
        if loop is None:
            return

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            writers = [w for c in self._conns for w in c.writers()]
            for c in list(self._conns):
                c.close(rst=False)
            self._conns.clear()
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in others:
                t.cancel()
            await asyncio.gather(*others, *(w.wait_closed() for w in writers), return_exceptions=True)
            if self._server is not None:
                await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(shutdown(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        loop.close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._loop is None:
            raise RuntimeError("the fault proxy is not started")
        return self._port

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>``: what clients connect to instead of the upstream."""
        return f"127.0.0.1:{self.port}"

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    def set_upstream(self, host: str, port: int) -> None:
        """Forward new connections to ``host:port``."""
        self.upstream = (host, port)

    # -- faults ----------------------------------------------------------------------------------------
    def cut(self) -> None:
        """Stop listening and close every open connection until :meth:`restore` (connections refused)."""
        self._call(lambda: self._outage("cut"))

    def reject(self) -> None:
        """Close every open connection and reset each new one at once (counted) until :meth:`restore`."""
        self._call(lambda: self._outage("reject"))

    def _outage(self, mode: Mode) -> None:
        self._mode = mode
        self._open.set()  # held connections end too
        self.stats.cut += len(self._conns)
        for c in list(self._conns):
            c.close(rst=False)
        self._conns.clear()
        if mode == "cut" and self._server is not None:
            self._server.close()
            self._server = None

    def reset(self) -> None:
        """Abort every open connection with a TCP RST (new connections pass)."""

        def act() -> None:
            self.stats.reset += len(self._conns)
            for c in list(self._conns):
                c.close(rst=True)
            self._conns.clear()

        self._call(act)

    def blackhole(self) -> None:
        """Accept but never answer until :meth:`restore`: open connections stop forwarding, new ones wait."""

        def act() -> None:
            self._mode = "blackhole"
            self._open.clear()
            self.stats.held += len(self._conns)

        self._call(act)

    def delay(self, seconds: float) -> None:
        """Forward every chunk ``seconds`` after it was read (0: no delay)."""

        def act() -> None:
            self._delay = max(0.0, seconds)

        self._call(act)

    def restore(self) -> None:
        """Pass traffic again: end a cut, a rejection or a blackhole (listening again on the same port after
        a cut), drop the delay."""
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(self._restore(), self._loop).result(10)

    async def _restore(self) -> None:
        if self._server is None:  # listening again before the mode says so
            self._server = await asyncio.start_server(self._handle, "127.0.0.1", self._port, reuse_address=True)
        self._mode = "pass"
        self._delay = 0.0
        self._open.set()

    def start_outage(self, kind: Outage) -> ProxyStats:
        """Start a ``kind`` fault; returns the stats at its start (for :meth:`ProxyStats.since`)."""
        before = self.stats.copy()
        {"cut": self.cut, "reject": self.reject, "blackhole": self.blackhole}[kind]()
        return before

    @contextmanager
    def fault(self, kind: Outage) -> Iterator[ProxyStats]:
        """``with proxy.fault("cut") as hit:`` the fault holds inside the block; ``hit`` (filled in when the
        block ends) holds what it did."""
        before = self.start_outage(kind)
        hit = ProxyStats()
        try:
            yield hit
        finally:
            self.restore()
            for f in fields(hit):
                setattr(hit, f.name, getattr(self.stats.since(before), f.name))

    def outage_for(self, seconds: float, kind: Outage = "cut") -> ProxyStats:
        """Start a ``kind`` fault that ends by itself after ``seconds``; returns the stats at its start (for
        :meth:`ProxyStats.since`). The fault's length is a parameter of the fault, not a wait of the test."""
        before = self.start_outage(kind)
        assert self._loop is not None
        loop = self._loop
        loop.call_soon_threadsafe(loop.call_later, seconds, lambda: loop.create_task(self._restore()))
        return before

    @property
    def mode(self) -> str:
        return self._mode

    def _call(self, fn: Callable[[], None]) -> None:
        if self._loop is None:
            raise RuntimeError("the fault proxy is not started")

        async def run() -> None:
            fn()

        self._run(run())

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    # -- forwarding ------------------------------------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats.accepted += 1
        if self._mode in ("cut", "reject"):  # (cut: accepted just before the listener closed)
            self.stats.refused += 1
            _rst(writer)
            return
        conn = _Conn(writer)
        self._conns.add(conn)
        if not self._open.is_set():
            self.stats.held += 1
            await self._open.wait()
            if self.mode in ("cut", "reject") or conn not in self._conns:
                return  # cut while held (the outage closed it)
        if self.upstream is None:
            self.stats.upstream_failed += 1
            self._drop(conn, rst=True)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            self.stats.upstream_failed += 1
            self._drop(conn, rst=True)
            return
        if conn not in self._conns:  # cut or reset while connecting
            up_writer.transport.abort()
            return
        conn.upstream = up_writer
        self.stats.forwarded += 1
        conn.tasks = [
            *self._direction(conn, reader, up_writer, "bytes_up"),
            *self._direction(conn, up_reader, writer, "bytes_down"),
        ]
        await asyncio.gather(*conn.tasks, return_exceptions=True)

    def _drop(self, conn: _Conn, rst: bool) -> None:
        self._conns.discard(conn)
        conn.close(rst)

    def _direction(
        self, conn: _Conn, src: asyncio.StreamReader, dst: asyncio.StreamWriter, counter: str
    ) -> list[asyncio.Task[None]]:
        """Two tasks copying ``src`` to ``dst`` through a queue: the reader stamps each chunk with the time
        it is due (now + delay), the writer waits for that time and for the blackhole to end. So a delay
        is latency, not a rate limit; an end of stream (None) closes the whole connection."""
        queue: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue(maxsize=16)

        async def read() -> None:
            try:
                while True:
                    data = await src.read(_CHUNK)
                    await queue.put((time.monotonic() + self._delay, data or None))
                    if not data:
                        return
            except (ConnectionError, OSError):
                await queue.put((time.monotonic(), None))

        async def write() -> None:
            try:
                while True:
                    due, data = await queue.get()
                    await self._open.wait()
                    if due > time.monotonic():
                        await asyncio.sleep(due - time.monotonic())
                    if data is None or conn not in self._conns:
                        break
                    dst.write(data)
                    setattr(self.stats, counter, getattr(self.stats, counter) + len(data))
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            if conn in self._conns:
                self._drop(conn, rst=False)

        return [asyncio.create_task(read()), asyncio.create_task(write())]
