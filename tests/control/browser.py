"""A real headless browser for the dashboard test: Debian's chromium, driven over the DevTools protocol.

The browser is started with a fresh profile and without anything that reaches out to the network;
:func:`chromium` *fails* (never skips) when it cannot start, naming what to install.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

__all__ = ["Page", "chromium", "launcher"]

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)


def _binary() -> str:
    found = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)
    if found is None:
        pytest.fail("the dashboard test needs Debian's chromium: apt-get install -y chromium", pytrace=False)
    return found


@contextmanager
def chromium(tmp: Path, start_timeout: float = 90.0) -> Iterator[int]:
    """Start chromium headless with a fresh profile under ``tmp``; yields its DevTools port."""
    profile = tmp / "chromium-profile"
    profile.mkdir(parents=True)
    log_path = tmp / "chromium.log"
    cmd = [_binary(), *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0", "about:blank"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + start_timeout
        while not (port_file.exists() and port_file.read_text().strip()):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(
                    f"chromium did not start (exit code {proc.poll()}): {log_path.read_text()[-2000:]}",
                    pytrace=False,
                )
            time.sleep(0.1)
        yield int(port_file.read_text().split()[0])
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 15)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait(10)


@contextmanager
def launcher(tmp: Path, start_timeout: float = 90.0) -> Iterator[tuple[Path, Callable[[], int]]]:
    """A browser command for ``$BROWSER`` (what Python's ``webbrowser`` and so ``sluice dashboard --open``
    run): it starts chromium headless with a fresh profile under ``tmp`` on the address it is given, in
    the background. Yields (the command, a function that waits for that chromium and returns its DevTools
    port); the chromium is stopped at the end."""
    profile = tmp / "chromium-profile"
    profile.mkdir(parents=True)
    log_path, pid_file = tmp / "chromium.log", tmp / "chromium.pid"
    script = tmp / "sluice-test-browser"  # not named like a browser webbrowser knows: run as given
    flags = " ".join([*FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0"])
    script.write_text(
        f'#!/bin/sh\nsetsid {_binary()} {flags} "$1" >{log_path} 2>&1 </dev/null &\necho $! >{pid_file}\n'
    )
    script.chmod(0o700)

    def devtools_port() -> int:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + start_timeout
        while not (port_file.exists() and port_file.read_text().strip()):
            if time.monotonic() > deadline:
                log = log_path.read_text()[-2000:] if log_path.exists() else "(no log)"
                pytest.fail(f"chromium did not start from {script}: {log}", pytrace=False)
            time.sleep(0.1)
        return int(port_file.read_text().split()[0])

    try:
        yield script, devtools_port
    finally:
        if pid_file.exists():
            pid = int(pid_file.read_text())
            try:
                os.killpg(pid, 15)
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and _alive(pid):
                    time.sleep(0.1)
                os.killpg(pid, 9)
            except ProcessLookupError:
                pass


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


class Page:
    """One browser tab over the DevTools protocol (use inside ``async with``)."""

    def __init__(self, devtools_port: int) -> None:
        self.port = devtools_port
        self._id = 0
        self._session: aiohttp.ClientSession | None = None
        self._ws: Any = None

    async def __aenter__(self) -> Page:
        self._session = aiohttp.ClientSession()
        async with self._session.get(f"http://127.0.0.1:{self.port}/json/list") as r:
            targets = await r.json()
        page = next(t for t in targets if t.get("type") == "page")
        self._ws = await self._session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._session is not None:
            await self._session.close()

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._id += 1
        await self._ws.send_str(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads((await self._ws.receive(timeout=60)).data)
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})  # type: ignore[no-any-return]

    async def evaluate(self, expression: str) -> Any:
        r = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return r.get("result", {}).get("value")

    async def wait_for(self, expression: str, timeout: float = 60.0) -> Any:
        """Poll ``expression`` until it is truthy; returns its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                where = await self.evaluate("location.href + ': ' + (document.body ? document.body.innerText : '')")
                raise AssertionError(f"not true within {timeout}s: {expression} (at {str(where)[:500]})")
            await asyncio.sleep(0.25)

    async def screenshot(self, path: Path, width: int = 1400, height: int = 1500) -> None:
        await self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        shot = await self.call("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(shot["data"]))
