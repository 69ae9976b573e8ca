"""Browser sessions are not the token: a one-time login code or the token buys a session cookie valid on
its own random address only; the API takes the token only as a Bearer header, the session only as that
cookie. Actions check their fields (400 naming the field), and idle connections cannot pile up."""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path

import pytest
from sluice.control.client import ControlClient
from sluice.control.connections import MAX_CONNECTIONS
from sluice.control.sessions import BrowserSessions

from tests.control.conftest import request, wait_for
from tests.control.test_endpoint import start

JSON = {"Content-Type": "application/json"}
PAGE = {**JSON, "X-Sluice-Request": "1"}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_codes_are_single_use_and_sessions_expire() -> None:
    clock = Clock()
    s = BrowserSessions(ttl=60.0, code_ttl=10.0, clock=clock)
    code = s.new_code()
    assert s.code_state(code) == "pending"
    opened = s.redeem(code)
    assert opened is not None and s.code_state(code) == "used"
    assert s.redeem(code) is None  # used up
    sid, session = opened
    assert session.path.startswith("/s/") and session.path.endswith("/") and len(session.path) > 20
    assert s.find(sid, session.path) is session and s.max_age(session) == 60
    assert s.find(sid, "/s/another/") is None and s.find(session.path, session.path) is None
    late = s.new_code()
    clock.now += 10.0
    assert s.code_state(late) == "expired" and s.redeem(late) is None
    assert s.code_state("never-issued") == "expired"
    clock.now += 50.0
    assert s.find(sid, session.path) is None  # expired
    sid2, session2 = s.open()
    s.close(sid2)
    assert s.find(sid2, session2.path) is None  # logged out
    first = s.open()
    for _ in range(40):  # the table is bounded: the oldest sessions go first
        s.open()
    assert s.find(first[0], first[1].path) is None


def _login(url: str, body: dict[str, str], headers: dict[str, str] = PAGE) -> tuple[int, dict[str, str], str]:
    status, answer, h = request(url + "/login", "POST", headers, json.dumps(body).encode())
    return status, answer, h.get("Set-Cookie", "")


def test_a_session_is_not_the_token_and_a_code_works_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    client = start(tmp_path)
    ep = client.control
    token = Path(ep.token_file).read_text()
    api = ControlClient(ep.url, token)
    bearer = {"Authorization": f"Bearer {token}"}
    secrets: list[str] = [token]
    try:
        grant = api.login_code()
        code = grant["code"]
        secrets.append(code)
        assert grant["login_url"] == f"{ep.url}/login#code={code}" and token not in grant["login_url"]
        assert _login(ep.url, {"code": code}, JSON)[0] == 403  # not from the login page
        assert _login(ep.url, {"code": code}, {**PAGE, "Origin": "http://127.0.0.1:1"})[0] == 403
        assert _login(ep.url, {"code": code}, {**PAGE, "Origin": "null"})[0] == 403  # a file:// page
        status, answer, cookie = _login(ep.url, {"code": code})
        assert status == 200 and answer["dashboard"].startswith("/s/")
        path = answer["dashboard"]
        attributes = [a.strip().lower() for a in cookie.split(";")]
        assert "httponly" in attributes and "samesite=strict" in attributes and f"path={path}".lower() in attributes
        assert any(a.startswith("max-age=") for a in attributes)
        sid = cookie.split(";")[0].split("=", 1)[1]
        secrets.append(sid)
        assert sid != token and token not in cookie
        status, answer, _ = _login(ep.url, {"code": code})  # a used code is refused
        assert status == 401 and "used already or has expired" in answer["error"]
        assert api.get(f"/api/v1/login-codes/{code}")["state"] == "used"

        jar = {"Cookie": f"sluice_session={sid}"}
        assert request(ep.url + path + "api/v1/job", headers=jar)[0] == 200
        assert request(ep.url + path, headers=jar)[0] == 200  # the dashboard page
        # the session is no token, and works nowhere else; the token is no session
        assert request(ep.url + "/api/v1/job", headers={"Authorization": f"Bearer {sid}"})[0] == 401
        assert request(ep.url + "/api/v1/job", headers=jar)[0] == 401
        assert request(ep.url + "/s/elsewhere/api/v1/job", headers=jar)[0] == 401
        assert request(ep.url + path + "api/v1/job", headers={"Cookie": f"sluice_session={token}"})[0] == 401
        assert request(ep.url + path + "api/v1/job", headers=bearer)[0] == 401
        status, _, headers = request(ep.url + path, headers={"Cookie": f"sluice_session={token}"})
        assert status == 303 and headers["Location"] == "/login"
        # a session cannot make login codes (only the token can)
        assert request(ep.url + path + "api/v1/login-codes", "POST", {**jar, **PAGE}, b"{}")[0] in (401, 404)
        # CSRF: a POST with the cookie needs the page's header and origin
        sp = ep.url + path + "api/v1/savepoint"
        assert request(sp, "POST", {**jar, **JSON}, b"{}")[0] == 403
        assert request(sp, "POST", {**jar, **PAGE, "Origin": "http://127.0.0.1:1"}, b"{}")[0] == 403
        status, answer, _ = request(sp, "POST", {**jar, **PAGE, "Origin": ep.url}, b"{}")
        assert status == 200 and "savepoint-" in answer["path"]

        # the token typed into the login form buys a session too; a wrong one does not
        assert _login(ep.url, {"token": "x" * 43})[0] == 401
        status, answer, cookie2 = _login(ep.url, {"token": token})
        assert status == 200 and answer["dashboard"] != path
        sid2 = cookie2.split(";")[0].split("=", 1)[1]
        secrets.append(sid2)
        jar2 = {"Cookie": f"sluice_session={sid2}"}
        logout = ep.url + answer["dashboard"] + "logout"
        assert request(logout, "POST", {**jar2, **PAGE}, b"{}")[0] == 200
        assert request(ep.url + answer["dashboard"] + "api/v1/job", headers=jar2)[0] == 401

        # sessions and codes expire
        ep.login.sessions.ttl = 1.0
        ep.login.sessions.code_ttl = 1.0
        stale = api.login_code()["code"]
        status, answer, cookie3 = _login(ep.url, {"code": api.login_code()["code"]})
        jar3 = {"Cookie": cookie3.split(";")[0]}
        assert status == 200 and "max-age=1" in cookie3.lower()
        wait_for("the session expires", lambda: request(ep.url + answer["dashboard"] + "api/v1/job", headers=jar3)[0] == 401)
        wait_for("the code expires", lambda: api.get(f"/api/v1/login-codes/{stale}")["state"] == "expired")
        assert _login(ep.url, {"code": stale})[0] == 401
    finally:
        client.cancel()
    logged = caplog.text + "".join(str(r.args) for r in caplog.records)
    assert not [s for s in secrets if s in logged]


def test_actions_check_their_fields(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Before: {"timeout": "abc"} answered 500 with a traceback in the job's log; {"timeout": -1} answered
    409 "failed" though the savepoint completed."""
    caplog.set_level(logging.DEBUG)
    client = start(tmp_path)
    ep = client.control
    headers = {"Authorization": f"Bearer {Path(ep.token_file).read_text()}", **JSON}
    chk = tmp_path / "chk" / "ctl"
    try:
        for body, message in [
            ({"timeout": "abc"}, '"timeout" must be a number of seconds > 0 (got "abc")'),
            ({"timeout": -1}, '"timeout" must be a number of seconds > 0 (got -1)'),
            ({"timeout": 0}, '"timeout" must be a number of seconds > 0 (got 0)'),
            ({"timeout": True}, '"timeout" must be a number of seconds > 0 (got true)'),
            ({"timout": 5}, 'unknown field "timout" (allowed: "timeout")'),
        ]:
            status, answer, _ = request(ep.url + "/api/v1/savepoint", "POST", headers, json.dumps(body).encode())
            assert (status, answer) == (400, {"error": message}), body
        assert not list(chk.glob("savepoint-*")), "a refused request took a savepoint"
        status, answer, _ = request(ep.url + "/api/v1/stop", "POST", headers, b'{"savepoint": "no"}')
        assert (status, answer["error"]) == (400, '"savepoint" must be true or false (got "no")')
        status, answer, _ = request(ep.url + "/api/v1/stop", "POST", headers, b"[1]")
        assert (status, answer["error"]) == (400, "the body must be a JSON object")
        status, answer, _ = request(ep.url + "/api/v1/cancel", "POST", headers, b'{"now": true}')
        assert (status, answer["error"]) == (400, 'unknown field "now" (allowed: none)')
        assert client.status == "running"
        status, answer, _ = request(ep.url + "/api/v1/savepoint", "POST", headers, b'{"timeout": 120}')
        assert status == 200 and (Path(answer["path"]) / "_metadata").exists()
    finally:
        client.cancel()
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


def _closed(s: socket.socket) -> bool:
    """Whether the server closed ``s``: an orderly end of stream, or a reset (a connection closed with
    unread input, such as half a header, ends with RST)."""
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def test_idle_connections_are_capped_and_closed(tmp_path: Path) -> None:
    """Connections that send nothing (or half a header) neither pile up nor keep the API from answering:
    above the cap the longest idle one is closed, and an idle one is closed after the idle timeout.
    Before: aiohttp kept every one of them open for its hour-long keep-alive timeout."""
    client = start(tmp_path)
    ep = client.control
    api = ControlClient(ep.url, Path(ep.token_file).read_text())
    host, port = ep.url.removeprefix("http://").split(":")
    idle: list[socket.socket] = []
    try:
        for i in range(MAX_CONNECTIONS + 16):
            s = socket.create_connection((host, int(port)), timeout=60)
            if i % 2:
                s.sendall(b"GET /api/v1/job HTTP/1.1\r\nHost: x\r\n")  # half a header, never finished
            idle.append(s)
        assert api.get("/api/v1/job")["status"] == "running"  # the endpoint answers all the same
        for s in idle[:16]:  # the oldest idle ones were closed to make room
            assert _closed(s), "an idle connection over the cap stayed open"
        assert ep.connections.evicted >= 16
        ep.connections.idle_timeout = 0.5
        late = socket.create_connection((host, int(port)), timeout=60)
        assert _closed(late)  # closed once idle for longer than the idle timeout
        late.close()
        assert api.get("/api/v1/job")["status"] == "running"
    finally:
        for s in idle:
            s.close()
        client.cancel()
