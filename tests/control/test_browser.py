"""The dashboard in a real headless browser (Debian's chromium, started here; the test fails, never skips,
if it cannot start): the page of a running job draws that job's checkpoints, its graph and its buttons
(a screenshot is saved under the test's tmp dir); and the browser's login holds nothing another local
web service could use."""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
from sluice import CheckpointConfig, Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.control.client import ControlClient
from sluice.sinks.testing import TwoPhaseCommitTestSink

from tests.control.browser import Page, chromium, launcher
from tests.control.conftest import request, sluice, wait_for

CHECKPOINT_IDS = "[...document.querySelectorAll('#plot-duration g[data-checkpoint]')].map(g => +g.dataset.checkpoint)"


def slow(batch: pa.RecordBatch) -> pa.RecordBatch:
    time.sleep(0.003)
    return batch


def test_the_dashboard_plots_the_running_jobs_checkpoints(tmp_path: Path) -> None:
    p = Pipeline("dashboard", parallelism=2, checkpoint=CheckpointConfig(interval=0.3, storage=str(tmp_path / "chk")))
    src = GeneratorSource(num_splits=2, records_per_split=10**7, batch_size=50, rows_per_second=8000)
    p.source(src, name="orders").rebalance().map_batches(slow, name="enrich").sink(
        TwoPhaseCommitTestSink(str(tmp_path / "out")), name="parquet"
    )
    client = p.start(runtime="local", restore="none")
    try:
        api = ControlClient(client.control.url, Path(client.control.token_file).read_text())
        wait_for("three checkpoints", lambda: api.get("/api/v1/job")["checkpoint_counts"]["completed"] >= 3)

        async def look(devtools_port: int) -> tuple[list[int], list[int], str, list[str]]:
            async with Page(devtools_port) as page:
                await page.call("Page.enable")
                await page.call("Page.navigate", url=api.login_code()["login_url"])
                await page.wait_for("document.body.dataset.loaded === '1' && location.pathname.startsWith('/s/')")
                # wait until the plots show at least the checkpoints that had completed before
                known = [c["checkpoint_id"] for c in api.get("/api/v1/checkpoints")["history"] if c["status"] == "completed"]
                shown = await page.wait_for(
                    f"(ids => {known}.every(k => ids.includes(k)) && ids)({CHECKPOINT_IDS})", timeout=90
                )
                sizes = await page.evaluate(
                    "[...document.querySelectorAll('#plot-size g[data-checkpoint]')].map(g => +g.dataset.checkpoint)"
                )
                header = await page.evaluate("document.getElementById('job-id').textContent + ' ' + "
                                             "document.getElementById('status').textContent")
                vertices = await page.evaluate(
                    "[...document.querySelectorAll('#graph g.vertex title')].map(t => t.textContent)"
                )
                # each vertex's figures: the sink's real rate (it emits nothing downstream) and the watermark
                stats = await page.wait_for(
                    "(t => t.some(s => /written [1-9]/.test(s)) && t.filter(s => s.startsWith('watermark 20'))"
                    ".length === 2 && t)([...document.querySelectorAll('#graph g.vertex text.vstat')]"
                    ".map(t => t.textContent))",
                    timeout=90,
                )
                await page.screenshot(tmp_path / "dashboard.png")
                return shown, sizes, header, vertices, stats

        with chromium(tmp_path) as port:
            shown, sizes, header, vertices, stats = asyncio.run(look(port))
        # the generator's event time starts at 2020-09-13 12:26:40 UTC (1_600_000_000_000 ms), 10 ms a row
        assert all(s.startswith("watermark 2020-09-") and s.endswith(" UTC") for s in stats[2::3]), stats
        assert " · out " in stats[0] and " · written " in stats[3] and " · out " not in stats[3], stats
        assert set(shown) <= {c["checkpoint_id"] for c in api.get("/api/v1/checkpoints")["history"]}
        assert len(shown) >= 3 and sizes == shown  # every plot shows the same checkpoints of this job
        assert header == "dashboard running"
        assert vertices == ["orders", "rebalance -> enrich -> parquet"]
        png = (tmp_path / "dashboard.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    finally:
        client.cancel()


class Recorder(http.server.BaseHTTPRequestHandler):
    """Another local web service: records what the browser sends it."""

    seen: list[tuple[str, list[str]]] = []

    def do_GET(self) -> None:
        self.seen.append((self.path, self.headers.get_all("Cookie") or []))
        body = b"<!doctype html><title>another service</title><p>hello"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return None


def test_the_browser_login_leaks_nothing_another_local_port_could_use(tmp_path: Path) -> None:
    """`sluice dashboard --open` logs chromium in with a one-time code that is on no command line; the
    session cookie is HttpOnly, SameSite=Strict, scoped to its own random path and expires; another web
    service on 127.0.0.1 that the same browser visits receives nothing the API accepts; a used code and an
    expired session are refused. Before: the cookie held the token, Path=/, and `--open` put the token on
    chromium's command line."""
    Recorder.seen.clear()
    p = Pipeline("sessions", parallelism=1, checkpoint=CheckpointConfig(interval=0.5, storage=str(tmp_path / "chk")))
    src = GeneratorSource(num_splits=1, records_per_split=10**7, batch_size=50, rows_per_second=2000)
    p.source(src).sink(TwoPhaseCommitTestSink(str(tmp_path / "out")))
    client = p.start(runtime="local", restore="none")
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    other_url = f"http://127.0.0.1:{other.server_address[1]}"
    try:
        ep = client.control
        token = Path(ep.token_file).read_text()
        api = ControlClient(ep.url, token)
        with launcher(tmp_path) as (browser, devtools_port):
            env = {**os.environ, "BROWSER": str(browser)}
            opened = sluice("dashboard", "sessions", "--storage", str(tmp_path / "chk"), "--open", env=env)
            assert f"logged the browser in to the dashboard at {ep.url}" in opened.stdout
            assert token not in opened.stdout + opened.stderr
            port = devtools_port()
            command_lines = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
            launched = [line for line in command_lines.splitlines() if str(tmp_path / "chromium-profile") in line]
            assert launched and any("file:///" in line and "sluice-login-" in line for line in launched)
            assert not [line for line in launched if token in line or "code=" in line or ep.url in line]

            async def browse() -> dict[str, Any]:
                async with Page(port) as page:
                    await page.call("Page.enable")
                    await page.wait_for("document.body && document.body.dataset.loaded === '1'", timeout=90)
                    path = await page.evaluate("location.pathname")
                    readable = await page.evaluate("document.cookie")
                    cookies = (await page.call("Network.getAllCookies"))["cookies"]
                    # the same browser visits another web service on this host, at its root and at paths
                    # the endpoint uses
                    for where in ("/", "/login", "/api/v1/job", "/s/"):
                        await page.call("Page.navigate", url=other_url + where)
                        await page.wait_for(f"location.href === {json.dumps(other_url + where)} && document.readyState === 'complete'")
                    # a login code works once: the second visit is refused
                    login_url = api.login_code()["login_url"]
                    await page.call("Page.navigate", url=login_url)
                    await page.wait_for("document.body && document.body.dataset.loaded === '1' && location.pathname.startsWith('/s/')")
                    await page.call("Page.navigate", url=login_url)
                    await page.wait_for("document.body && document.body.dataset.failed === '1'")
                    refused = await page.evaluate("document.getElementById('message').textContent")
                    # a session ends: this one (with a short lifetime) sends the dashboard back to the login page
                    ep.login.sessions.ttl = 3.0
                    await page.call("Page.navigate", url=api.login_code()["login_url"])
                    await page.wait_for("document.body && document.body.dataset.loaded === '1' && location.pathname.startsWith('/s/')")
                    short = await page.evaluate("location.pathname")
                    await page.wait_for("location.pathname === '/login'", timeout=90)
                    return {"path": path, "readable": readable, "cookies": cookies, "refused": refused, "short": short}

            seen = asyncio.run(browse())
        assert seen["path"].startswith("/s/") and seen["readable"] == ""  # HttpOnly: no script reads it
        (cookie,) = [c for c in seen["cookies"] if c["name"] == "sluice_session"]
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == seen["path"]
        assert not cookie["session"] and cookie["expires"] > time.time()  # it has an expiry
        assert cookie["value"] != token
        # the other service received no cookie at all, and nothing it got is accepted by the API
        assert [path for path, _ in Recorder.seen if path != "/favicon.ico"] == ["/", "/login", "/api/v1/job", "/s/"]
        received = [c for _, cookies in Recorder.seen for c in cookies]
        assert received == [] and token not in repr(Recorder.seen)
        for value in [cookie["value"], *received]:
            refused = request(ep.url + "/api/v1/job", headers={"Authorization": f"Bearer {value}"})[0]
            assert refused == 401
        assert "used already or has expired" in seen["refused"]
        assert request(ep.url + seen["short"] + "api/v1/job")[0] == 401
        assert client.status == "running"
    finally:
        other.shutdown()
        client.cancel()
