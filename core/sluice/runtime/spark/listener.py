"""A listening socket that no idle or slow peer can stall: concurrent handshakes, each with a deadline, and
a cap on unauthenticated connections.

Each accepted connection runs the authentication handshake (:func:`sluice.runtime.spark.rpc.server_handshake`,
after TLS if configured) in a thread of its own, so a peer that connects and sends nothing delays nobody.
A connection has :data:`~sluice.runtime.spark.rpc.HANDSHAKE_TIMEOUT` for its whole handshake (not per read:
a byte now and then does not keep it), and at most ``max_pending`` connections may be in their handshake at
once: above that the oldest is dropped, so connections held open by someone without the secret cannot keep
a legitimate peer out (a peer answers at once, so it is never the oldest for long).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sluice.runtime.spark.rpc import HANDSHAKE_TIMEOUT, TlsConfig, server_handshake, shutdown

__all__ = ["Listener", "max_pending"]

log = logging.getLogger("sluice.spark.rpc")


def max_pending(peers: int) -> int:
    """The cap on connections in their handshake for a listener that ``peers`` connect to at about the
    same time: room for all of them twice over, and at least 16."""
    return max(16, 2 * peers)


@dataclass
class _Pending:
    accepted: float
    waker: socket.socket  # a duplicate of the connection's socket: shutting it down ends the handshake


class Listener:
    """Accepts connections on ``server`` and authenticates each in a thread of its own.

    Args:
        server: A bound, listening socket (closed by :meth:`close`).
        secret: The job secret peers must prove.
        tls: Optional TLS (the socket is wrapped before the handshake).
        on_peer: Called with each authenticated socket and its address, in that connection's thread, which
            it may use for more set-up; it owns the socket.
        name: For log lines and thread names.
        max_pending: Connections that may be in their handshake at once; the oldest is dropped above it.
        handshake_timeout: Seconds a connection has for its whole handshake.
    """

    def __init__(
        self,
        server: socket.socket,
        secret: bytes,
        tls: TlsConfig | None,
        on_peer: Callable[[socket.socket, tuple[str, int]], None],
        name: str,
        max_pending: int = 16,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
    ) -> None:
        self._server = server
        # set here, not in the accept thread: a close() before that thread runs would make it fail (EBADF)
        self._server.settimeout(0.25)  # to end late handshakes and notice close() between connections
        self._secret = secret
        self._tls = tls.server_context() if tls is not None else None  # once, not per connection
        self._on_peer = on_peer
        self.name = name
        self.max_pending = max_pending
        self.handshake_timeout = handshake_timeout
        #: connections in their handshake, oldest first
        self._pending: dict[socket.socket, _Pending] = {}
        self._lock = threading.Lock()
        self._closed = False
        #: unauthenticated connections dropped: failed or late handshakes, and the oldest over the cap
        self.dropped = 0
        self._warned = -1e9
        self._thread = threading.Thread(target=self._accept, name=f"{name}-accept", daemon=True)

    def start(self) -> Listener:
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop accepting, close the listening socket, and end the handshakes still running."""
        self._closed = True
        try:
            self._server.close()
        except OSError:
            pass
        with self._lock:
            pending, self._pending = list(self._pending.values()), {}
        for p in pending:
            _wake(p)
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(2.0)

    def _accept(self) -> None:
        while not self._closed:
            try:
                sock, addr = self._server.accept()
            except TimeoutError:
                self._drop_late()
                continue
            except OSError as exc:
                if self._closed:
                    return
                log.warning("%s: accept failed: %s", self.name, exc)  # e.g. out of file descriptors
                time.sleep(0.1)
                continue
            try:
                waker = sock.dup()
            except OSError as exc:
                log.warning("%s: accept failed: %s", self.name, exc)
                sock.close()
                continue
            with self._lock:
                self._pending[sock] = _Pending(time.monotonic(), waker)
                over = [self._pending.pop(s) for s in list(self._pending)[: -self.max_pending]]
            for p in over:
                self._dropped(f"over {self.max_pending} connections in their handshake, the oldest goes")
                _wake(p)
            threading.Thread(
                target=self._authenticate, args=(sock, addr), name=f"{self.name}-handshake", daemon=True
            ).start()
            self._drop_late()

    def _drop_late(self) -> None:
        oldest = time.monotonic() - self.handshake_timeout
        with self._lock:
            late = [s for s, p in self._pending.items() if p.accepted < oldest]
            dropped = [self._pending.pop(s) for s in late]
        for p in dropped:
            self._dropped(f"no handshake within {self.handshake_timeout:.0f}s")
            _wake(p)

    def _authenticate(self, raw: socket.socket, addr: tuple[str, int]) -> None:
        sock = raw
        try:
            raw.settimeout(self.handshake_timeout)
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                sock = self._tls.wrap_socket(raw, server_side=True)
            server_handshake(sock, self._secret)
            failure = None
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            failure = exc
        with self._lock:
            mine = self._pending.pop(raw, None)
        if mine is None or failure is not None:
            if mine is not None:  # else dropped above, and counted there
                mine.waker.close()
                self._dropped(f"{addr[0]}:{addr[1]}: {failure}")
            sock.close()
            return
        mine.waker.close()
        sock.settimeout(None)
        try:
            self._on_peer(sock, addr)
        except BaseException:
            log.exception("%s: setting up the connection from %s:%s failed", self.name, addr[0], addr[1])
            shutdown(sock)

    def _dropped(self, why: str) -> None:
        with self._lock:
            self.dropped += 1
            n = self.dropped
            now = time.monotonic()
            warn = now - self._warned > 10.0  # one line per burst, not one per connection
            if warn:
                self._warned = now
        if warn:
            log.warning("%s: dropped an unauthenticated connection (%d so far): %s", self.name, n, why)


def _wake(pending: _Pending) -> None:
    """End a handshake another thread is running (that thread closes its socket)."""
    try:
        pending.waker.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    pending.waker.close()
