"""Helpers of the control tests: the CLI as a subprocess (a second shell), polling with generous limits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def sluice(*args: str, env: dict[str, str] | None = None, timeout: float = 180.0, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``sluice ARGS`` in a new process, as a user would from another shell."""
    r = subprocess.run(
        [sys.executable, "-m", "sluice.cli", *args],
        capture_output=True, text=True, timeout=timeout, env=env or dict(os.environ),
    )
    if check:
        assert r.returncode == 0, f"sluice {' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
    return r


def sluice_json(*args: str, env: dict[str, str] | None = None) -> Any:
    return json.loads(sluice(*args, "--json", env=env).stdout)


def wait_for(what: str, predicate: Callable[[], Any], limit_s: float = 120.0, alive: Callable[[], bool] | None = None) -> Any:
    """Poll ``predicate`` until it returns something truthy (a safety limit, not a timing assertion)."""
    deadline = time.monotonic() + limit_s
    while True:
        value = predicate()
        if value:
            return value
        if alive is not None and not alive():
            raise AssertionError(f"the job ended before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {limit_s}s: {what}")
        time.sleep(0.2)


def request(
    url: str, method: str = "GET", headers: dict[str, str] | None = None, body: bytes | None = None
) -> tuple[int, Any, Any]:
    """(status, parsed body, response headers) without following redirects."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    req = urllib.request.Request(url, method=method, headers=headers or {}, data=body)
    try:
        with opener.open(req, timeout=30) as r:
            raw, status, hdrs = r.read(), r.status, r.headers
    except urllib.error.HTTPError as exc:
        raw, status, hdrs = exc.read(), exc.code, exc.headers
    try:
        return status, json.loads(raw), hdrs
    except ValueError:
        return status, raw.decode(), hdrs
