"""Whoever can write the checkpoint storage can write a job's registry entry (``_control.json``); the CLI
must never send the job's token to a URL such an entry names (issue 22: the entry decided where the token
went). Entries are signed with the job's token; the CLI checks the signature before it sends anything."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sluice.checkpoint.storage_loader import checkpoint_storage
from sluice.control.client import ControlClient, ControlError
from sluice.control.registry import RegistryEntry, token_path, write_token


class _Trap(http.server.BaseHTTPRequestHandler):
    """The attacker's endpoint: records every Authorization header it gets, answers like a job."""

    seen: list[str] = []

    def do_GET(self) -> None:
        type(self).seen.append(self.headers.get("Authorization", ""))
        body = json.dumps({"status": "running"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def trap() -> Iterator[tuple[str, list[str]]]:
    seen: list[str] = []
    handler = type("Trap", (_Trap,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def _job(tmp_path: Path) -> tuple[str, str, Path]:
    """A job's checkpoint storage with its token file, as its control endpoint leaves them."""
    chk = str(tmp_path / "chk")
    storage = checkpoint_storage(chk, "orders")
    path = token_path(storage)
    return chk, write_token(path), path


def test_a_rewritten_entry_never_receives_the_token(tmp_path: Path, trap: tuple[str, list[str]]) -> None:
    url, seen = trap
    chk, token, token_file = _job(tmp_path)
    storage = checkpoint_storage(chk, "orders")
    genuine = RegistryEntry.new("orders", "http://127.0.0.1:9", "local", str(token_file), token)
    # the attacker points the job's entry at their endpoint, keeping the job's token file: unsigned, signed
    # with a token they made up, or the genuine signature on the altered fields
    forgeries = [
        RegistryEntry(**{**genuine.__dict__, "url": url, "mac": ""}),
        RegistryEntry.new("orders", url, "local", str(token_file), "m" * 43),
        RegistryEntry(**{**genuine.__dict__, "url": url}),
    ]
    for forged in forgeries:
        forged.write(storage)
        with pytest.raises(ControlError, match="not signed with the job's token") as info:
            ControlClient.connect("orders", chk).get("/api/v1/job")
        assert "\n" not in str(info.value) and token not in str(info.value)
        # `sluice jobs` asks every running job for its status: not this one
        r = subprocess.run(
            [sys.executable, "-m", "sluice.cli", "jobs", "--storage", chk, "--json"],
            capture_output=True, text=True, timeout=120,
        )
        assert r.returncode == 0, r.stderr
        (row,) = json.loads(r.stdout)
        assert row["status"] == "unverified", row
    assert seen == [], "the job's token reached the URL of a forged registry entry"
    # the entry the job signed is followed
    RegistryEntry(**{**genuine.__dict__, "url": url}).signed(token).write(storage)
    assert ControlClient.connect("orders", chk).get("/api/v1/job") == {"status": "running"}
    assert seen == [f"Bearer {token}"]


def test_an_entry_naming_the_attackers_own_token_file_gets_only_that_token(
    tmp_path: Path, trap: tuple[str, list[str]]
) -> None:
    """An attacker can sign an entry with a token file of their own: the CLI then sends *that* token, which
    they knew already, never the job's."""
    url, seen = trap
    chk, token, _ = _job(tmp_path)
    theirs = tmp_path / "attacker.token"
    their_token = write_token(theirs)
    RegistryEntry.new("orders", url, "local", str(theirs), their_token).write(checkpoint_storage(chk, "orders"))
    ControlClient.connect("orders", chk).get("/api/v1/job")
    assert seen == [f"Bearer {their_token}"] and token not in seen[0]

