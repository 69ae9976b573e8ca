"""A real PostgreSQL server for tests, started from Debian's ``postgresql`` package (never a mock).

``initdb`` into a fresh temporary folder, ``max_prepared_transactions`` raised (it defaults to 0, which
disables two-phase commit), listening on 127.0.0.1 at a free port with password (SCRAM) authentication,
then ``pg_ctl start``. ``initdb`` and ``postgres`` refuse to run as root, so when the tests run as root the
server runs as the ``postgres`` user (created by the Debian package; created here if it is missing) and its
folder is owned by it. Nothing is skipped: a server that cannot start raises with its log.

Usage::

    with PostgresServer() as pg:
        conninfo = pg.conninfo()          # host, port, user, password, dbname
        pg.kill()                         # pg_ctl stop -m immediate: a crash, recovered by start()
        pg.start()
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["PostgresServer", "PostgresUnavailableError", "find_pg_bin"]

#: the password of the test superuser (a test fixture's, never a real one)
PASSWORD = "pg-test-secret-7f3a"
USER = "sluice"


class PostgresUnavailableError(RuntimeError):
    """The PostgreSQL binaries are missing or the server did not start (the message says why)."""


def find_pg_bin() -> Path:
    """The newest ``/usr/lib/postgresql/<version>/bin`` that has ``initdb``."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if not found:
        raise PostgresUnavailableError(
            "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb): apt-get install -y postgresql"
        )
    return Path(found[-1]).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _server_user() -> tuple[int, int] | None:
    """``(uid, gid)`` to run the server as when we are root (None: run as ourselves)."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam("postgres")
    except KeyError:  # a machine without Debian's package user: make a system user for it
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "postgres"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        entry = pwd.getpwnam("postgres")
    return entry.pw_uid, entry.pw_gid


class PostgresServer:
    """A throw-away PostgreSQL cluster on a random loopback port.

    Args:
        max_prepared_transactions: the server setting (two-phase commit needs it above 0).
        settings: more ``-c name=value`` server settings.
    """

    def __init__(self, max_prepared_transactions: int = 100, settings: dict[str, Any] | None = None) -> None:
        self.bin = find_pg_bin()
        self.max_prepared_transactions = max_prepared_transactions
        self.settings = dict(settings or {})
        self.port = 0
        self.base: Path | None = None
        self._owner = _server_user()

    # -- process --------------------------------------------------------------------------------------
    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        kw: dict[str, Any] = {}
        if self._owner is not None:
            kw = {"user": self._owner[0], "group": self._owner[1], "extra_groups": []}
        return subprocess.run(
            list(args), capture_output=True, text=True, timeout=timeout, cwd=str(self.base), **kw
        )

    @property
    def data(self) -> Path:
        assert self.base is not None, "not initialized"
        return self.base / "data"

    def _log(self) -> str:
        try:
            return (self.data.parent / "server.log").read_text()[-3000:]
        except OSError:
            return "(no log)"

    def init(self) -> PostgresServer:
        """initdb into a new folder under the system's temporary folder (readable by the server's user)."""
        self.base = Path(tempfile.mkdtemp(prefix="sluice-pg-"))
        pwfile = self.base / "pw"
        pwfile.write_text(PASSWORD + "\n")
        if self._owner is not None:
            for p in (self.base, pwfile):
                os.chown(p, *self._owner)
        r = self._run(
            str(self.bin / "initdb"), "-D", str(self.data), "-U", USER, f"--pwfile={pwfile}",
            "--auth-host=scram-sha-256", "--auth-local=peer", "--encoding=UTF8", "--locale=C", "--no-sync",
        )  # fmt: skip
        pwfile.unlink()
        if r.returncode != 0:
            raise PostgresUnavailableError(f"initdb failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
        return self

    def start(self, timeout: float = 60.0) -> PostgresServer:
        """Start the server (again, after :meth:`kill` or :meth:`stop`: it recovers from its WAL)."""
        if self.base is None:
            self.init()
        for _ in range(3):  # a port taken between _free_port and the bind: try another
            self.port = self.port or _free_port()
            options = {
                "port": self.port,
                "listen_addresses": "127.0.0.1",
                "unix_socket_directories": str(self.base),
                "max_prepared_transactions": self.max_prepared_transactions,
                "max_connections": 200,
                "shared_buffers": "64MB",
                **self.settings,
            }
            opts = " ".join(f"-c {k}={v}" for k, v in options.items())
            r = self._run(
                str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.data.parent / "server.log"),
                "-o", opts, "-w", "-t", str(int(timeout)), "start", timeout=timeout + 30,
            )  # fmt: skip
            if r.returncode == 0:
                self._wait_ready(timeout)
                return self
            if "could not bind" in self._log() or "Address already in use" in self._log():
                self.port = 0
                continue
            break
        raise PostgresUnavailableError(
            f"pg_ctl start failed: {r.stdout.strip()} {r.stderr.strip()}\n{self._log()}"
        )

    def _wait_ready(self, timeout: float) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.conninfo(), connect_timeout=5) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError as exc:
                if time.monotonic() > deadline:
                    raise PostgresUnavailableError(
                        f"the server does not answer: {exc}\n{self._log()}"
                    ) from exc
                time.sleep(0.1)

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m <mode>`` (``fast``: a clean shutdown; ``immediate``: a crash)."""
        if self.base is None or not (self.data / "postmaster.pid").exists():
            return
        r = self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")
        if r.returncode != 0 and (self.data / "postmaster.pid").exists():
            raise PostgresUnavailableError(f"pg_ctl stop -m {mode} failed: {r.stderr.strip()}")

    def kill(self) -> None:
        """Crash the server (``pg_ctl stop -m immediate``: no checkpoint, recovery from the WAL at start)."""
        self.stop("immediate")

    def close(self) -> None:
        """Stop the server and delete its folder."""
        try:
            self.stop("immediate")
        finally:
            if self.base is not None:
                shutil.rmtree(self.base, ignore_errors=True)
                self.base = None

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- clients --------------------------------------------------------------------------------------
    def conninfo(self, dbname: str = "postgres") -> str:
        """A libpq connection string with the test superuser's password."""
        return f"host=127.0.0.1 port={self.port} user={USER} password={PASSWORD} dbname={dbname}"

    def new_database(self) -> str:
        """A new, empty database; returns its connection string."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.conninfo(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.conninfo(name)

    def query(
        self, sql: str, *params: Any, dbname: str = "postgres", conninfo: str | None = None
    ) -> list[tuple[Any, ...]]:
        """Rows of one query, in its own autocommit connection."""
        import psycopg

        with psycopg.connect(conninfo or self.conninfo(dbname), autocommit=True) as conn:
            cur = conn.execute(sql, params or None)  # type: ignore[arg-type]
            return list(cur.fetchall()) if cur.description else []
