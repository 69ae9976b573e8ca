"""A cap on the control endpoint's open HTTP connections, and an end to idle ones.

aiohttp serves connections concurrently, but it has no limit on how many are open, and it keeps a
connection that sends no request for its keep-alive timeout (an hour by default). A peer that opens
connections and sends nothing, or a request header a byte at a time (slowloris), would use up the driver
process's file descriptors, and with them the job's. :class:`ConnectionGuard` admits every new connection,
but above its limit first closes the one idle (no request in progress) the longest, and every second it
closes connections idle for longer than ``idle_timeout``: a header that is not complete by then counts as
idle, while a request in progress (a stop that waits for its savepoint) is never cut. A client that keeps
its connection open between requests (the dashboard, a browser) simply opens a new one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

__all__ = ["IDLE_TIMEOUT", "MAX_CONNECTIONS", "ConnectionGuard"]

log = logging.getLogger("sluice.control")

#: open connections above which the longest idle one is closed
MAX_CONNECTIONS = 64
#: seconds a connection may stay without a request in progress
IDLE_TIMEOUT = 15.0
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class _Connection:
    opened: float
    last: float
    busy: int = 0
    seen: bool = False


class ConnectionGuard:
    """Admits the endpoint's connections (``factory`` is the listener's protocol factory) and tracks their
    requests (``middleware``, the outermost one); runs on the server's event loop only.

    Set :attr:`server` (the aiohttp low-level server whose connections it guards) before the first
    connection.

    Args:
        limit: Open connections above which the longest idle one is closed.
        idle_timeout: Seconds a connection may stay without a request in progress.
    """

    def __init__(
        self,
        limit: int = MAX_CONNECTIONS,
        idle_timeout: float = IDLE_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.server: web.Server | None = None
        self.limit = limit
        self.idle_timeout = idle_timeout
        self._clock = clock
        self._conns: dict[RequestHandler, _Connection] = {}
        #: connections closed to make room for a new one
        self.evicted = 0
        self._last_warning = -1e9

    def factory(self) -> RequestHandler:
        """A handler for a new connection; makes room for it by closing the longest idle ones."""
        assert self.server is not None
        handler = self.server()
        now = self._clock()
        self._conns[handler] = _Connection(now, now)
        self._enforce(now)
        return handler

    def _enforce(self, now: float) -> None:
        assert self.server is not None
        live = set(self.server.connections)
        for h, c in list(self._conns.items()):  # forget the closed: seen open before, or never opened
            if h in live:
                c.seen = True
            elif c.seen or now - c.opened > 5.0:
                del self._conns[h]
        over = len(self._conns) - self.limit  # open ones plus those about to open
        if over <= 0:
            return
        idle = sorted((h for h in live if h in self._conns and self._conns[h].busy == 0), key=self._last)
        for h in idle[:over]:
            del self._conns[h]
            h.force_close()
            self.evicted += 1
        if idle and now - self._last_warning > 60.0:  # a flood: say so, but not once per connection
            self._last_warning = now
            log.warning(
                "the control endpoint has over %d connections open: it closes the longest idle ones "
                "(%d so far)",
                self.limit,
                self.evicted,
            )

    def _last(self, handler: RequestHandler) -> float:
        return self._conns[handler].last

    @web.middleware
    async def middleware(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        conn = self._conns.get(request.protocol)
        if conn is None:
            return await handler(request)
        conn.busy += 1
        try:
            return await handler(request)
        finally:
            conn.busy -= 1
            conn.last = self._clock()

    async def sweep(self, every: float = 1.0) -> None:
        """Close connections idle for longer than ``idle_timeout``, forever (cancel it to stop)."""
        while True:
            await asyncio.sleep(every)
            if self.server is None:
                continue
            now = self._clock()
            for h in self.server.connections:
                c = self._conns.get(h)
                if c is not None and c.busy == 0 and now - c.last > self.idle_timeout:
                    h.force_close()
            self._enforce(now)
