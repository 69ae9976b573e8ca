"""The job's control endpoint: a small authenticated HTTP API and the dashboard, served by the driver.

Built on aiohttp, in a daemon thread of the driver with its own event loop: aiohttp is made to be embedded
like this (an ``AppRunner`` on a socket we bind ourselves, so a bad address fails at once in the caller,
with no signal handlers and no logging configuration of its own), shuts down gracefully (a request in
flight, such as a stop, gets its answer), and its client speaks WebSocket, which the browser test uses.

Every request needs the job's token (:mod:`sluice.control.registry` writes it to a file only the user can
read): ``Authorization: Bearer <token>``, or, for a browser, a cookie set by ``/?token=<token>`` (the
address ``sluice dashboard JOB`` prints) or the login form. A POST authenticated by the cookie must carry
``X-Sluice-Request: 1`` (the dashboard's buttons do; a page of another site cannot), so the cookie cannot
be used for cross-site requests. No access log is written and the token is never logged.

API (JSON; see docs/operations.md): ``GET /api/v1/job`` status, attempts, failures, last checkpoint;
``GET /api/v1/graph``; ``GET /api/v1/metrics``; ``GET /metrics`` (Prometheus);
``GET /api/v1/checkpoints[?limit=N]`` and ``/api/v1/checkpoints/{id}``; ``POST /api/v1/savepoint``;
``POST /api/v1/stop`` (``{"savepoint": true, "drain": false}``); ``POST /api/v1/cancel``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hmac
import html
import json
import logging
import os
import socket
import threading
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from sluice.checkpoint.storage import checkpoint_storage
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
_STATIC = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}
_OPEN = ("/login", "/static/dashboard.css")


def _static(name: str) -> bytes:
    return resources.files("sluice.control").joinpath("static", name).read_bytes()


class ControlEndpoint:
    """The control endpoint of one job (start it with :meth:`start`).

    Attributes:
        url: Where it serves, e.g. ``http://127.0.0.1:41234``.
        token_file: The file holding its token.
    """

    def __init__(self, client: JobClient, sock: socket.socket, token: str, token_file: str) -> None:
        self.client = client
        self._sock = sock
        self._token = token.encode()
        self.token_file = token_file
        host, port = sock.getsockname()[:2]
        shown = "127.0.0.1" if host == "0.0.0.0" else ("::1" if host == "::" else host)
        self.url = f"http://[{shown}]:{port}" if ":" in shown else f"http://{shown}:{port}"
        self._cookie = f"sluice_token_{port}"
        self._registry = job_registry(client.monitor)
        self._pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="sluice-control")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="sluice-control", daemon=True)
        self._runner: web.AppRunner | None = None
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
        app = web.Application(middlewares=[self._auth])
        r = app.router
        r.add_get("/", self._dashboard)
        r.add_get("/static/{name}", self._static_file)
        r.add_post("/login", self._login)
        r.add_get("/api/v1/job", self._job)
        r.add_get("/api/v1/graph", self._graph)
        r.add_get("/api/v1/metrics", self._metrics_json)
        r.add_get("/metrics", self._prometheus)
        r.add_get("/api/v1/checkpoints", self._checkpoints)
        r.add_get("/api/v1/checkpoints/{id}", self._checkpoint)
        r.add_post("/api/v1/savepoint", self._savepoint)
        r.add_post("/api/v1/stop", self._stop)
        r.add_post("/api/v1/cancel", self._cancel)
        self._thread.start()
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=30.0)
        asyncio.run_coroutine_threadsafe(self._runner.setup(), self._loop).result(30)
        site = web.SockSite(self._runner, self._sock)
        asyncio.run_coroutine_threadsafe(site.start(), self._loop).result(30)

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
                self._entry.ended(self.client.status.value, self._token.decode()).write(storage)
        except Exception as exc:
            log.warning("could not mark the job's registry entry as ended: %s", exc)
        try:
            os.unlink(self.token_file)
        except OSError:
            pass

    # -- authentication --------------------------------------------------------------------------------
    def _valid(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self._token)

    @web.middleware
    async def _auth(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        if request.path in _OPEN:
            return await handler(request)
        if "token" in request.query:  # a browser arriving from `sluice dashboard`: trade it for a cookie
            if not self._valid(request.query["token"]):
                return self._refused(request)
            rest = request.url.without_query_params("token")
            return self._with_cookie(_redirect(str(rest.relative())))
        header = request.headers.get("Authorization", "")
        if header.startswith("Bearer "):
            if not self._valid(header[len("Bearer ") :].strip()):
                return self._refused(request)
        elif self._valid(request.cookies.get(self._cookie)):
            if request.method == "POST" and request.headers.get("X-Sluice-Request") != "1":
                return web.json_response({"error": "a POST needs the header X-Sluice-Request: 1"}, status=403)
        else:
            return self._refused(request)
        return await handler(request)

    def _refused(self, request: web.Request) -> web.StreamResponse:
        if request.method == "GET" and request.path == "/":
            page = _static("login.html").decode().replace("{{TOKEN_FILE}}", html.escape(self.token_file))
            return web.Response(text=page, content_type="text/html", status=401)
        return web.json_response(
            {
                "error": f"unauthorized: send the job's token (Authorization: Bearer ..., from {self.token_file})"
            },
            status=401,
            headers={"WWW-Authenticate": 'Bearer realm="sluice"'},
        )

    def _with_cookie(self, response: web.StreamResponse) -> web.StreamResponse:
        response.set_cookie(self._cookie, self._token.decode(), httponly=True, samesite="Strict", path="/")
        return response

    async def _login(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        given = form.get("token")
        if not isinstance(given, str) or not self._valid(given.strip()):
            return _redirect("/?login=failed")
        return self._with_cookie(_redirect("/"))

    # -- pages -----------------------------------------------------------------------------------------
    async def _dashboard(self, request: web.Request) -> web.StreamResponse:
        return web.Response(body=_static("dashboard.html"), content_type="text/html")

    async def _static_file(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in _STATIC:
            raise web.HTTPNotFound()
        return web.Response(body=_static(name), content_type=_STATIC[name])

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
        history = self.client.monitor.checkpoints()
        shown = history[-limit:] if limit > 0 else []
        counts: dict[str, int] = {}
        for c in history:
            counts[c.status.value] = counts.get(c.status.value, 0) + 1
        return _json(
            {"counts": counts, "total": len(history), "history": [checkpoint_dict(c) for c in shown]}
        )

    async def _checkpoint(self, request: web.Request) -> web.StreamResponse:
        try:
            cid = int(request.match_info["id"])
        except ValueError:
            return _error(400, "a checkpoint id is an integer")
        found = [c for c in self.client.monitor.checkpoints() if c.checkpoint_id == cid]
        if not found:
            return _error(404, f"job {self.client.config.job_id} has no checkpoint {cid}")
        return _json(checkpoint_dict(found[-1], with_tasks=True))

    # -- actions ---------------------------------------------------------------------------------------
    async def _body(self, request: web.Request) -> dict[str, Any]:
        if not request.can_read_body:
            return {}
        try:
            data = await request.json()
        except ValueError as exc:
            raise web.HTTPBadRequest(text=json.dumps({"error": f"the body is not JSON: {exc}"})) from exc
        return data if isinstance(data, dict) else {}

    async def _blocking(self, fn: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    def _not_running(self, action: str) -> web.StreamResponse | None:
        status = self.client.status
        if status is JobStatus.RUNNING:
            return None
        return _error(409, f"the job is {status.value}: only a running job can {action}")

    async def _savepoint(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        refused = self._not_running("take a savepoint")
        if refused is not None:
            return refused
        timeout = float(body.get("timeout", 600.0))
        try:
            path = await self._blocking(lambda: self.client.trigger_savepoint(timeout))
        except CheckpointError as exc:
            return _error(409, f"the savepoint failed: {exc}")
        return _json({"path": path})

    async def _stop(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        refused = self._not_running("be stopped")
        if refused is not None:
            return refused
        savepoint, drain = bool(body.get("savepoint", True)), bool(body.get("drain", False))
        timeout = float(body.get("timeout", 600.0))
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
        try:
            result = await self._blocking(self.client.cancel)
        except SluiceError as exc:
            return _error(500, f"the job failed: {exc}")
        return _json({"status": result.status.value, "attempts": result.attempts})


def _json(data: Any) -> web.Response:
    return web.json_response(data, dumps=lambda d: json.dumps(d, default=str))


def _redirect(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location})


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)
