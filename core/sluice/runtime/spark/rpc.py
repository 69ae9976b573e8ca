"""Authenticated TCP connections for the Spark runtime: handshake, optional TLS, framed messages.

Every connection (slot -> driver control, slot -> slot data) starts with a mutual HMAC challenge-response
over a per-job secret: the server sends a nonce, the client answers ``HMAC(secret, "client" + nonce)`` and
its own nonce, the server answers ``HMAC(secret, "server" + client nonce)``. A peer without the secret is
dropped before it can read or inject a single frame. With :class:`TlsConfig` the socket is wrapped in TLS
(both sides present the certificate and verify the other against the CA) before the handshake.
:class:`~sluice.runtime.spark.listener.Listener` serves the listening sockets.

:class:`MessageConnection` carries control messages (:mod:`sluice.runtime.spark.messages`, which encodes and
decodes them) in length-prefixed frames. A frame is only ever decoded from a peer that proved it holds the
job secret.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import queue
import socket
import ssl
import struct
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass

import sluice.runtime.spark.messages as messages

__all__ = [
    "HANDSHAKE_TIMEOUT",
    "AuthenticationError",
    "MessageConnection",
    "TlsConfig",
    "address_family",
    "client_handshake",
    "connect",
    "recv_exact",
    "server_handshake",
]

log = logging.getLogger("sluice.spark.rpc")

_MAGIC = b"SLUICE1\n"
_NONCE = 32
_LEN = struct.Struct("!I")
#: seconds an accepted connection has for its whole authentication handshake (a peer connects and answers
#: at once; this only bounds how long an idle connection holds a place)
HANDSHAKE_TIMEOUT = 5.0


class AuthenticationError(ConnectionError):
    """The peer does not hold the job secret (or broke the handshake)."""


@dataclass(frozen=True)
class TlsConfig:
    """TLS for every sluice connection of a job (PEM text, so it ships to executors with the job).

    Both ends present ``cert_pem`` and verify the peer's certificate against ``ca_pem`` (the certificate
    itself when self-signed). Host names are not checked: slots connect by IP; the CA is the trust anchor.
    """

    cert_pem: str
    key_pem: str
    ca_pem: str

    @classmethod
    def from_files(cls, cert: str, key: str, ca: str | None = None) -> TlsConfig:
        with open(cert) as c, open(key) as k:
            cert_pem, key_pem = c.read(), k.read()
        ca_pem = cert_pem
        if ca:
            with open(ca) as f:
                ca_pem = f.read()
        return cls(cert_pem, key_pem, ca_pem)

    def _context(self, purpose: int) -> ssl.SSLContext:
        ctx = ssl.SSLContext(purpose)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cadata=self.ca_pem)
        # load_cert_chain only reads files: write them privately and remove them at once
        fd, path = tempfile.mkstemp(prefix="sluice-tls-", suffix=".pem")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(self.key_pem + "\n" + self.cert_pem)
            ctx.load_cert_chain(path)
        finally:
            os.unlink(path)
        return ctx

    def server_context(self) -> ssl.SSLContext:
        return self._context(ssl.PROTOCOL_TLS_SERVER)

    def client_context(self) -> ssl.SSLContext:
        return self._context(ssl.PROTOCOL_TLS_CLIENT)

    def __repr__(self) -> str:
        return "TlsConfig(<pem>)"  # never print key material


def address_family(host: str) -> socket.AddressFamily:
    """The socket family to listen on ``host`` (an IP literal): IPv6 if it has a colon."""
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def recv_exact(sock: socket.socket, n: int) -> bytearray:
    """Read exactly ``n`` bytes; raises ConnectionError on EOF."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("connection closed by peer")
        got += k
    return buf


def _mac(secret: bytes, role: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, role + nonce, hashlib.sha256).digest()


def server_handshake(sock: socket.socket, secret: bytes) -> None:
    """Challenge the connecting peer; raises AuthenticationError if it does not prove the secret."""
    nonce = os.urandom(_NONCE)
    sock.sendall(_MAGIC + nonce)
    reply = recv_exact(sock, 32 + _NONCE)
    if not hmac.compare_digest(bytes(reply[:32]), _mac(secret, b"client", nonce)):
        raise AuthenticationError("peer failed the sluice authentication handshake")
    sock.sendall(_mac(secret, b"server", bytes(reply[32:])))


def client_handshake(sock: socket.socket, secret: bytes) -> None:
    """Answer the server's challenge and check that the server holds the secret too."""
    hello = recv_exact(sock, len(_MAGIC) + _NONCE)
    if bytes(hello[: len(_MAGIC)]) != _MAGIC:
        raise AuthenticationError("not a sluice endpoint")
    mine = os.urandom(_NONCE)
    sock.sendall(_mac(secret, b"client", bytes(hello[len(_MAGIC) :])) + mine)
    answer = recv_exact(sock, 32)
    if not hmac.compare_digest(bytes(answer), _mac(secret, b"server", mine)):
        raise AuthenticationError("server failed the sluice authentication handshake")


def connect(
    host: str, port: int, secret: bytes, tls: TlsConfig | None, timeout: float = HANDSHAKE_TIMEOUT
) -> socket.socket:
    """Open an authenticated (and, with ``tls``, encrypted) connection."""
    sock = socket.create_connection((host, port), timeout=timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is not None:
            sock = tls.client_context().wrap_socket(sock)
        client_handshake(sock, secret)
    except BaseException:
        sock.close()
        raise
    sock.settimeout(None)
    return sock


def accept(
    server: socket.socket, secret: bytes, tls: TlsConfig | None
) -> tuple[socket.socket, tuple[str, int]] | None:
    """Accept one connection and authenticate it; None (connection dropped) if it fails the handshake."""
    sock, addr = server.accept()
    try:
        sock.settimeout(HANDSHAKE_TIMEOUT)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is not None:
            sock = tls.server_context().wrap_socket(sock, server_side=True)
        server_handshake(sock, secret)
        sock.settimeout(None)
        return sock, addr
    except (OSError, ssl.SSLError) as exc:
        log.warning("rejected a connection from %s:%s: %s", addr[0], addr[1], exc)
        sock.close()
        return None


def shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


#: how long a connection whose write failed waits for its reader to take what the peer sent before it ended
DRAIN_S = 2.0


class MessageConnection:
    """Control messages over an authenticated socket: a writer thread and a reader thread.

    ``send`` never blocks (the writer thread owns the socket's send side), so a slow or dead peer cannot
    stall the caller (e.g. the checkpoint coordinator). ``on_message`` runs on the reader thread;
    ``on_close(error)`` runs once when the connection ends (``error`` None after a local ``close``).
    """

    def __init__(
        self,
        sock: socket.socket,
        on_message: Callable[[messages.Message], None],
        on_close: Callable[[BaseException | None], None],
        name: str = "sluice-rpc",
    ) -> None:
        self.sock = sock
        self._on_message = on_message
        self._on_close = on_close
        self._out: queue.SimpleQueue[tuple[bytes, threading.Event | None] | None] = queue.SimpleQueue()
        self._closed = threading.Event()
        self._close_once = threading.Lock()
        self._write_error: BaseException | None = None
        self._reader = threading.Thread(target=self._read, name=f"{name}-in", daemon=True)
        self._writer = threading.Thread(target=self._write, name=f"{name}-out", daemon=True)

    def start(self) -> None:
        self._writer.start()
        self._reader.start()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def send(self, msg: messages.Message) -> None:
        """Queue ``msg``; dropped silently once the connection is closed."""
        if not self._closed.is_set():
            self._out.put((messages.encode(msg), None))

    def send_sync(self, msg: messages.Message, timeout: float = 2.0) -> bool:
        """Send ``msg`` and wait until it was written to the socket (e.g. right before a crash)."""
        if self._closed.is_set():
            return False
        done = threading.Event()
        self._out.put((messages.encode(msg), done))
        return done.wait(timeout)

    def close(self, flush_timeout: float = 0.0) -> None:
        """Close; with ``flush_timeout`` first wait that long for queued messages to be written."""
        if flush_timeout > 0 and not self._closed.is_set():
            done = threading.Event()
            self._out.put((b"", done))
            done.wait(flush_timeout)
        self._finish(None)

    def _finish(self, error: BaseException | None) -> None:
        with self._close_once:
            if self._closed.is_set():
                return
            self._closed.set()
        self._out.put(None)
        shutdown(self.sock)
        self._on_close(error)

    def _write(self) -> None:
        try:
            while True:
                item = self._out.get()
                if item is None:
                    return
                data, done = item
                if data:
                    self.sock.sendall(_LEN.pack(len(data)) + data)
                if done is not None:
                    done.set()
        except (OSError, ValueError) as exc:
            # A peer that closed after its last messages (a slot's failure report) breaks the pipe of the
            # next write; those messages may still wait unread. The reader takes them before the connection
            # ends, so the failure they report is not lost to this write's error; a reader the peer leaves
            # blocked (no end of stream) is cut off after DRAIN_S.
            self._write_error = exc
            timer = threading.Timer(DRAIN_S, self._finish, (exc,))
            timer.daemon = True
            timer.start()

    def _read(self) -> None:
        try:
            while True:
                (n,) = _LEN.unpack(recv_exact(self.sock, _LEN.size))
                self._on_message(messages.decode(recv_exact(self.sock, n)))
        except (OSError, ValueError, EOFError) as exc:
            self._finish((self._write_error or exc) if not self._closed.is_set() else None)
        except BaseException as exc:  # a handler bug must not leave a silent half-open connection
            log.exception("message handler failed")
            self._finish(exc)
