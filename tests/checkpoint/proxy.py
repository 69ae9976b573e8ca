"""A small asyncio TCP proxy for storage outages: forwards a local port to a target until it is cut.

While cut, every open connection is closed and every new one is accepted and closed at once (a client sees
a connection reset, as when a network path or an endpoint goes away); ``refused`` counts those, so a
test counts only outages that fired.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class TcpProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target_host:target_port`` in a background thread."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.refused = 0
        self._cut = False
        self._loop = asyncio.new_event_loop()
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp-proxy", daemon=True)

    def start(self) -> TcpProxy:
        self._thread.start()
        self._server = self._run(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cut(self) -> None:
        """Close every connection and refuse new ones until :meth:`restore`."""
        self._cut = True
        self._run(self._close_all())

    def restore(self) -> None:
        self._cut = False

    def stop(self) -> None:
        self._cut = True
        self._run(self._close_all(server=True))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self, coro: object) -> object:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)  # type: ignore[arg-type]

    async def _close_all(self, server: bool = False) -> None:
        if server and self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.close()
        self._writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut:
            self.refused += 1
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    if self._cut:
                        break
                    dst.write(data)
                    await dst.drain()
            except OSError:
                pass
            finally:
                dst.close()
                self._writers.discard(dst)

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


@contextmanager
def proxy_to(host: str, port: int) -> Iterator[TcpProxy]:
    proxy = TcpProxy(host, port).start()
    try:
        yield proxy
    finally:
        proxy.stop()
