"""The job's control endpoint: a small authenticated HTTP API and the dashboard, served by the driver.

Built on aiohttp, in a daemon thread of the driver with its own event loop: aiohttp is made to be embedded
like this (an ``AppRunner`` on a socket we bind ourselves, so a bad address fails at once in the caller,
with no signal handlers and no logging configuration of its own), shuts down gracefully (a request in
flight, such as a stop, gets its answer), and its client speaks WebSocket, which the browser test uses.
:class:`~sluice.control.connections.ConnectionGuard` caps its open connections and ends idle ones.

The API (``/api/v1/...``, ``/metrics``) needs the job's token (:mod:`sluice.control.registry` writes it
to a file only the user can read) as ``Authorization: Bearer <token>``, and nothing else. A browser never
holds the token: it logs in at ``/login`` with a one-time login code (``POST /api/v1/login-codes``, which
``sluice dashboard JOB`` calls) or the token typed into the form, and gets a session
(:mod:`sluice.control.sessions`): a cookie valid only under its own random address ``/s/<random>/``,
where the dashboard and the same API live. A POST there must carry ``X-Sluice-Request: 1`` and, if the
browser sends one, this endpoint's ``Origin`` (the dashboard's buttons do; a page of another site cannot).
No access log is written; the token, codes and session ids are never logged.

API (JSON; see docs/operations.md): ``GET /api/v1/job`` status, attempts, failures, last checkpoint;
``GET /api/v1/graph``; ``GET /api/v1/metrics``; ``GET /metrics`` (Prometheus);
``GET /api/v1/checkpoints[?limit=N]`` and ``/api/v1/checkpoints/{id}``; ``POST /api/v1/savepoint``
(``{"timeout": S}``); ``POST /api/v1/stop`` (``{"savepoint": true, "drain": false, "timeout": S}``);
``POST /api/v1/cancel``; ``POST /api/v1/login-codes`` and ``GET /api/v1/login-codes/{code}``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hmac
import json
import logging
import math
import os
import socket
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from sluice.checkpoint.storage_loader import checkpoint_storage
from sluice.control.connections import ConnectionGuard
from sluice.control.login import BrowserLogin
from sluice.control.metrics import job_registry
from sluice.control.monitor import checkpoint_dict
from sluice.control.registry import RegistryEntry, parse_address, token_path, write_token
from sluice.errors import CheckpointError, ConfigError, IllegalTransitionError, SluiceError
from sluice.runtime.status import JobStatus

if TYPE_CHECKING:
    from sluice.client import JobClient

__all__ = ["ControlEndpoint"]

log = logging.getLogger("sluice.control")

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: the fields each action takes: name -> (type check, what is allowed, default)
_FIELDS: dict[str, tuple[Callable[[Any], bool], str, Any]] = {
    "timeout": (
        lambda v: isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0,
        "a number of seconds > 0",
        600.0,
    ),
    "savepoint": (lambda v: isinstance(v, bool), "true or false", True),
    "drain": (lambda v: isinstance(v, bool), "true or false", False),
}


class ControlEndpoint:
    """The control endpoint of one job (start it with :meth:`start`).

    Attributes:
        url: Where it serves, e.g. ``http://127.0.0.1:41234``.
        token_file: The file holding its token.
        login: The browser side: login codes, sessions (``login.sessions``) and pages.
        connections: The cap on open connections and the end of idle ones.
    """

    def __init__(self, client: JobClient, sock: socket.socket, token: str, token_file: str) -> None:
        self.client = client
        self._sock = sock
        self._token = token.encode()
        self.token_file = token_file
        host, port = sock.getsockname()[:2]
        shown = "127.0.0.1" if host == "0.0.0.0" else ("::1" if host == "::" else host)
        self.url = f"http://[{shown}]:{port}" if ":" in shown else f"http://{shown}:{port}"
        self.login = BrowserLogin(self.url, token_file, self._valid)
        self.connections = ConnectionGuard()
        self._registry = job_registry(client.monitor)
        self._pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="sluice-control")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="sluice-control", daemon=True)
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.AbstractServer | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._closing: concurrent.futures.Future[None] | None = None
        self._lock = threading.Lock()
        self._entry: RegistryEntry | None = None

    # -- lifecycle -------------------------------------------------------------------------------------
    @staticmethod
    def bind(address: str) -> socket.socket:
        """The listening socket for ``address`` (``HOST:PORT``; port 0 picks a free port), bound before the
        job starts so that a bad address fails at once.

        Raises:
            ConfigError: the address is malformed or cannot be bound.
        """
        host, port = parse_address(address)
        try:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            return socket.create_server((host, port), family=family)
        except OSError as exc:
            raise ConfigError(f"control_endpoint: cannot listen on {address}: {exc}") from exc

    @classmethod
    def start(cls, client: JobClient, sock: socket.socket) -> ControlEndpoint:
        """Serve ``client``'s job on ``sock`` (from :meth:`bind`), write its token file and registry entry,
        and close when the job ends."""
        cfg = client.config
        storage = checkpoint_storage(cfg.checkpoint.storage, cfg.job_id, **cfg.checkpoint.storage_options)
        path = token_path(storage)
        token = write_token(path)
        endpoint = cls(client, sock, token, str(path))
        endpoint._serve()
        entry = RegistryEntry.new(cfg.job_id, endpoint.url, client.monitor.runtime, str(path), token)
        try:
            entry.write(storage)
            endpoint._entry = entry
        except Exception as exc:  # the job runs all the same; the CLI can still be given --url
            log.warning("could not write the job's registry entry in %s: %s", storage.job_dir(), exc)
        client.monitor.start_sampling()
        client.control = endpoint
        client.on_end(endpoint.close_soon)
        log.info("job %s: control endpoint %s (token in %s)", cfg.job_id, endpoint.url, path)
        return endpoint

    def _serve(self) -> None:
        app = web.Application(middlewares=[self.connections.middleware, self._auth], client_max_size=64 * 1024)
        self.login.add_routes(app)
        r = app.router
        r.add_get("/metrics", self._prometheus)
        for prefix in ("", "/s/{key}"):  # the API: with the token, or in a browser session
            r.add_get(prefix + "/api/v1/job", self._job)
            r.add_get(prefix + "/api/v1/graph", self._graph)
            r.add_get(prefix + "/api/v1/metrics", self._metrics_json)
            r.add_get(prefix + "/api/v1/checkpoints", self._checkpoints)
            r.add_get(prefix + "/api/v1/checkpoints/{id}", self._checkpoint)
            r.add_post(prefix + "/api/v1/savepoint", self._savepoint)
            r.add_post(prefix + "/api/v1/stop", self._stop)
            r.add_post(prefix + "/api/v1/cancel", self._cancel)
        self._thread.start()
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=30.0)
        asyncio.run_coroutine_threadsafe(self._listen(self._runner), self._loop).result(30)

    async def _listen(self, runner: web.AppRunner) -> None:
        await runner.setup()
        self.connections.server = runner.server
        loop = asyncio.get_running_loop()
        self._listener = await loop.create_server(self.connections.factory, sock=self._sock)
        self._sweeper = loop.create_task(self.connections.sweep())

    def _run_loop(self) -> None:
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    def close_soon(self) -> None:
        """Mark the registry entry ended and delete the token file (at once: when the job's result is out,
        nothing writes next to its checkpoints any more), then begin a graceful shutdown of the server and
        return (requests in flight still get their answer)."""
        with self._lock:
            if self._closing is not None:
                return
            self._unregister()
            self._closing = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)

    def close(self, timeout: float = 30.0) -> None:
        """Shut down gracefully and wait for it (not from a request's thread: it waits for that request)."""
        self.close_soon()
        assert self._closing is not None
        try:
            self._closing.result(timeout)
        except concurrent.futures.TimeoutError:
            log.warning("the control endpoint did not shut down within %.0fs", timeout)
        self._thread.join(timeout)

    async def _shutdown(self) -> None:
        try:
            if self._sweeper is not None:
                self._sweeper.cancel()
            if self._listener is not None:
                self._listener.close()
            if self._runner is not None:
                await self._runner.cleanup()
        finally:
            self._pool.shutdown(wait=False)
            self._loop.call_soon(self._loop.stop)

    def _unregister(self) -> None:
        cfg = self.client.config
        try:
            if self._entry is not None:
                storage = checkpoint_storage(
                    cfg.checkpoint.storage, cfg.job_id, **cfg.checkpoint.storage_options
                )
                job = self.client.monitor.overview()
                last = (job.get("last_checkpoint") or {}).get("checkpoint_id")
                token = self._token.decode()
                self._entry.ended(self.client.status.value, token, job.get("attempt"), last).write(storage)
        except Exception as exc:
            log.warning("could not mark the job's registry entry as ended: %s", exc)
        try:
            os.unlink(self.token_file)
        except OSError:
            pass

    # -- authentication --------------------------------------------------------------------------------
    def _valid(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self._token)

    @web.middleware
    async def _auth(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        key = request.match_info.get("key")
        if key is not None:  # a browser session: its cookie on its own address, never the token
            refused = self.login.refusal(request, key)
            if refused is not None:
                return refused
        elif not self.login.is_open(request):  # the API: the token as a Bearer header, never a cookie
            header = request.headers.get("Authorization", "")
            if not (header.startswith("Bearer ") and self._valid(header[len("Bearer ") :].strip())):
                return web.json_response(
                    {
                        "error": f"unauthorized: send the job's token (Authorization: Bearer ..., from {self.token_file})"
                    },
                    status=401,
                    headers={"WWW-Authenticate": 'Bearer realm="sluice"'},
                )
        return await handler(request)

    # -- reads -----------------------------------------------------------------------------------------
    async def _job(self, request: web.Request) -> web.StreamResponse:
        return _json({**self.client.monitor.overview(), "url": self.url})

    async def _graph(self, request: web.Request) -> web.StreamResponse:
        return _json(self.client.monitor.graph())

    async def _metrics_json(self, request: web.Request) -> web.StreamResponse:
        return _json(self.client.monitor.metrics())

    async def _prometheus(self, request: web.Request) -> web.StreamResponse:
        body = generate_latest(self._registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _checkpoints(self, request: web.Request) -> web.StreamResponse:
        try:
            limit = int(request.query.get("limit", "100"))
        except ValueError:
            return _error(400, "limit must be an integer")
        history = self.client.monitor.checkpoints()  # the newest (CheckpointConfig.history_size)
        shown = history[-limit:] if limit > 0 else []
        totals, in_progress = self.client.monitor.checkpoint_counts()
        counts = {"completed": totals.completed, "failed": totals.failed}
        if in_progress:
            counts["in_progress"] = in_progress
        counts = {k: v for k, v in counts.items() if v}
        total = totals.completed + totals.failed + in_progress
        return _json({"counts": counts, "total": total, "history": [checkpoint_dict(c) for c in shown]})

    async def _checkpoint(self, request: web.Request) -> web.StreamResponse:
        try:
            cid = int(request.match_info["id"])
        except ValueError:
            return _error(400, "a checkpoint id is an integer")
        found = [c for c in self.client.monitor.checkpoints() if c.checkpoint_id == cid]
        if not found:
            return _error(
                404,
                f"job {self.client.config.job_id} has no checkpoint {cid} in its history (the newest "
                f"{self.client.config.checkpoint.history_size}: CheckpointConfig.history_size)",
            )
        return _json(checkpoint_dict(found[-1], with_tasks=True))

    # -- actions ---------------------------------------------------------------------------------------
    async def _body(self, request: web.Request) -> dict[str, Any]:
        if not request.can_read_body:
            return {}
        try:
            data = await asyncio.wait_for(request.json(), 10.0)  # a body sent a byte at a time ends here
        except (TimeoutError, ValueError) as exc:
            raise web.HTTPBadRequest(
                text=json.dumps({"error": f"the body is not JSON: {exc}"}), content_type="application/json"
            ) from exc
        if not isinstance(data, dict):
            raise web.HTTPBadRequest(
                text=json.dumps({"error": "the body must be a JSON object"}), content_type="application/json"
            )
        return data

    async def _options(self, request: web.Request, *names: str) -> dict[str, Any]:
        """The action's fields from the body, checked (400 names the field and what it allows)."""
        body = await self._body(request)
        unknown = sorted(set(body) - set(names))
        if unknown:
            allowed = ", ".join(f'"{n}"' for n in names) or "none"
            raise _bad_request(f'unknown field "{unknown[0]}" (allowed: {allowed})')
        out = {}
        for name in names:
            check, allowed, default = _FIELDS[name]
            value = body.get(name, default)
            if not check(value):
                raise _bad_request(f'"{name}" must be {allowed} (got {json.dumps(value)})')
            out[name] = value
        return out

    async def _blocking(self, fn: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    def _not_running(self, action: str) -> web.StreamResponse | None:
        status = self.client.status
        if status is JobStatus.RUNNING:
            return None
        return _error(409, f"the job is {status.value}: only a running job can {action}")

    async def _savepoint(self, request: web.Request) -> web.StreamResponse:
        timeout = float((await self._options(request, "timeout"))["timeout"])
        refused = self._not_running("take a savepoint")
        if refused is not None:
            return refused
        try:
            path = await self._blocking(lambda: self.client.trigger_savepoint(timeout))
        except CheckpointError as exc:
            return _error(409, f"the savepoint failed: {exc}")
        return _json({"path": path})

    async def _stop(self, request: web.Request) -> web.StreamResponse:
        o = await self._options(request, "savepoint", "drain", "timeout")
        savepoint, drain, timeout = o["savepoint"], o["drain"], float(o["timeout"])
        refused = self._not_running("be stopped")
        if refused is not None:
            return refused
        try:
            result = await self._blocking(lambda: self.client.stop(savepoint, drain, timeout))
        except CheckpointError as exc:
            return _error(409, f"the stop failed, the job goes on running: {exc}")
        except IllegalTransitionError:
            return _error(409, f"the job is {self.client.status.value}: only a running job can be stopped")
        except SluiceError as exc:
            return _error(500, f"the job failed while stopping: {exc}")
        return _json(
            {"status": result.status.value, "stopped_at": result.stopped_at, "attempts": result.attempts}
        )

    async def _cancel(self, request: web.Request) -> web.StreamResponse:
        await self._options(request)
        try:
            result = await self._blocking(self.client.cancel)
        except SluiceError as exc:
            return _error(500, f"the job failed: {exc}")
        return _json({"status": result.status.value, "attempts": result.attempts})


def _json(data: Any) -> web.Response:
    return web.json_response(data, dumps=lambda d: json.dumps(d, default=str))


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _bad_request(message: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(text=json.dumps({"error": message}), content_type="application/json")
