"""The browser's side of the control endpoint: the login page, login codes, sessions, the dashboard page.

``GET /login`` is the login page: its script (``static/login.js``) trades the one-time code in the
address's fragment (``/login#code=...``: a fragment never reaches a server, a log or a ``Referer``) or the
token typed into its form for a session (``POST /login``) and opens the session's dashboard,
``/s/<random>/``. ``POST /api/v1/login-codes`` (with the token) makes a code; ``GET
/api/v1/login-codes/{code}`` says whether a browser used it. Every response carries headers that keep
pages of other sites from framing the dashboard or learning its address (no ``Referer``).
"""

from __future__ import annotations

import asyncio
import html
from collections.abc import Callable
from importlib import resources

from aiohttp import web

from sluice.control.sessions import SESSION_COOKIE, BrowserSessions

__all__ = ["BrowserLogin", "from_this_page", "static"]

_STATIC = {"dashboard.js": "text/javascript", "dashboard.css": "text/css", "login.js": "text/javascript"}
_HEADERS = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",  # the session's address never leaves the page
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
}


def static(name: str) -> bytes:
    """A file of ``sluice/control/static``."""
    return resources.files("sluice.control").joinpath("static", name).read_bytes()


def from_this_page(request: web.Request) -> bool:
    """A POST that a page of this endpoint sent: it has the header ``X-Sluice-Request: 1`` (which a page of
    another origin can only send after a CORS preflight that this endpoint never answers) and, if the
    browser names one, this endpoint's ``Origin``."""
    origin = request.headers.get("Origin")
    # host and port only: behind a TLS proxy the page's scheme is https, the endpoint's http
    same = origin is None or origin.partition("://")[2] == request.host
    return same and request.headers.get("X-Sluice-Request") == "1"


class BrowserLogin:
    """Login codes, sessions and the pages of one endpoint.

    Args:
        url: The endpoint's address, e.g. ``http://127.0.0.1:41234``.
        token_file: Where the job's token is (the login page names it).
        valid_token: Whether a string is the job's token.
    """

    OPEN = ("/", "/login")

    def __init__(self, url: str, token_file: str, valid_token: Callable[[str], bool]) -> None:
        self.url = url
        self.token_file = token_file
        self._valid = valid_token
        self.sessions = BrowserSessions()

    def add_routes(self, app: web.Application) -> None:
        """The pages, the login and the login codes (the session's API is the server's)."""
        app.on_response_prepare.append(_secure_headers)
        r = app.router
        r.add_get("/", self._to_login)
        r.add_get("/login", self._login_page)
        r.add_post("/login", self._login)
        r.add_get("/static/{name}", self._static_file)
        r.add_get("/s/{key}/", self._dashboard)
        r.add_post("/s/{key}/logout", self._logout)
        r.add_post("/api/v1/login-codes", self._new_code)
        r.add_get("/api/v1/login-codes/{code}", self._code_state)

    def is_open(self, request: web.Request) -> bool:
        """A request that needs no authentication (the login page and its files)."""
        return request.path in self.OPEN or request.path.startswith("/static/")

    def refusal(self, request: web.Request, key: str) -> web.StreamResponse | None:
        """None if ``request`` (to ``/s/{key}/...``) carries that session's cookie and, for a POST, comes
        from its page; else the answer that refuses it."""
        if self.sessions.find(request.cookies.get(SESSION_COOKIE), f"/s/{key}/") is None:
            if request.method == "GET" and request.path == f"/s/{key}/":
                return web.Response(status=303, headers={"Location": "/login"})
            return _error(401, "the browser session ended or is unknown: log in again (sluice dashboard JOB)")
        if request.method == "POST" and not from_this_page(request):
            return _error(403, "a POST needs the header X-Sluice-Request: 1 and this endpoint's Origin")
        return None

    async def _to_login(self, request: web.Request) -> web.StreamResponse:
        return web.Response(status=303, headers={"Location": "/login"})  # an old ?token= is not kept

    async def _login_page(self, request: web.Request) -> web.StreamResponse:
        page = static("login.html").decode().replace("{{TOKEN_FILE}}", html.escape(self.token_file))
        return web.Response(text=page, content_type="text/html")

    async def _login(self, request: web.Request) -> web.StreamResponse:
        """Trade a login code (once) or the token for a session cookie."""
        if not from_this_page(request):
            return _error(403, "log in from the login page (the header X-Sluice-Request: 1 is missing)")
        try:
            body = await asyncio.wait_for(request.json(), 10.0)  # a body sent a byte at a time ends here
        except (TimeoutError, ValueError):
            body = None
        if not isinstance(body, dict):
            return _error(400, 'send {"code": CODE} or {"token": TOKEN}')
        code, token = body.get("code"), body.get("token")
        opened = None
        if isinstance(code, str):
            opened = self.sessions.redeem(code)
        elif isinstance(token, str) and self._valid(token.strip()):
            opened = self.sessions.open()
        if opened is None:
            if isinstance(code, str):
                return _error(
                    401, "this login code was used already or has expired: run `sluice dashboard JOB` again"
                )
            return _error(401, f"that is not the job's token (it is in {self.token_file})")
        sid, session = opened
        response = web.json_response({"dashboard": session.path})
        response.set_cookie(
            SESSION_COOKIE,
            sid,
            path=session.path,
            max_age=self.sessions.max_age(session),
            httponly=True,
            samesite="Strict",
        )
        return response

    async def _logout(self, request: web.Request) -> web.StreamResponse:
        self.sessions.close(request.cookies.get(SESSION_COOKIE))
        response = web.json_response({"logged_out": True})
        response.del_cookie(SESSION_COOKIE, path=f"/s/{request.match_info['key']}/")
        return response

    async def _new_code(self, request: web.Request) -> web.StreamResponse:
        code = self.sessions.new_code()
        return web.json_response(
            {
                "code": code,
                "login_url": f"{self.url}/login#code={code}",
                "expires_in_s": self.sessions.code_ttl,
            }
        )

    async def _code_state(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"state": self.sessions.code_state(request.match_info["code"])})

    async def _dashboard(self, request: web.Request) -> web.StreamResponse:
        return web.Response(body=static("dashboard.html"), content_type="text/html")

    async def _static_file(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in _STATIC:
            raise web.HTTPNotFound()
        return web.Response(body=static(name), content_type=_STATIC[name])


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def _secure_headers(request: web.Request, response: web.StreamResponse) -> None:
    for name, value in _HEADERS.items():
        response.headers.setdefault(name, value)
