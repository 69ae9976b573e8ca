"""A TCP proxy for fault tests: forwards a loopback port to a target and can cut and restore the link.

``cut()`` closes the listening socket and aborts every open connection, so clients see what they see when
a broker process dies (connection refused, reset); ``restore()`` listens on the same port again. The
proxy runs an asyncio loop in a daemon thread; every method is called from the test's thread.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Coroutine
from typing import Any

__all__ = ["TcpProxy", "free_port"]


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TcpProxy:
    """Forwards ``127.0.0.1:port`` to ``target`` (``(host, port)``) until cut.

    Args:
        target: Where connections go.
        port: The port to listen on (default: a free one).
    """

    def __init__(self, target: tuple[str, int], port: int | None = None) -> None:
        self.target = target
        self.port = port or free_port()
        #: times the link was cut
        self.cuts = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    def start(self) -> TcpProxy:
        self._thread.start()
        self.restore()
        return self

    def _run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    @property
    def is_cut(self) -> bool:
        return self._server is None

    def restore(self) -> None:
        """Listen (again) on :attr:`port`."""

        async def listen() -> None:
            if self._server is None:
                self._server = await asyncio.start_server(
                    self._serve, "127.0.0.1", self.port, reuse_address=True
                )

        self._run(listen())

    def cut(self) -> None:
        """Stop listening and abort every open connection (a dead broker, as clients see it)."""

        async def close() -> None:
            server, self._server = self._server, None
            if server is not None:
                server.close()
            for w in list(self._writers):
                w.transport.abort()
            self._writers.clear()

        self.cuts += 1
        self._run(close())

    def stop(self) -> None:
        if self._thread.is_alive():
            if self._server is not None:
                self.cut()

            async def drain() -> None:
                tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

            self._run(drain())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        if self._server is None:  # cut while connecting
            writer.transport.abort()
            up_writer.transport.abort()
            return
        self._writers.update((writer, up_writer))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                dst.transport.abort()
                self._writers.discard(dst)

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
