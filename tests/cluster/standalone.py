"""A Spark standalone cluster on loopback for tests: a master and workers from the installed pyspark.

Every process (master, workers, spark-submit drivers) starts in its own session (process group), with
``SPARK_LOCAL_IP=127.0.0.1``, ports the OS picks (port 0, web UIs too; the master's log tells its own), work and log dirs under the test's tmp dir, and an
environment tag (``SLUICE_TEST_CLUSTER``) that their children inherit (executor JVMs, pyspark daemons and
workers), so :meth:`StandaloneCluster.tagged` finds every process the cluster ever started, orphans
included. :meth:`StandaloneCluster.stop` kills the process groups it started and then checks that no
tagged process is left.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Proc", "StandaloneCluster", "spark_home"]

ROOT = Path(__file__).resolve().parent.parent.parent


def spark_home() -> Path:
    """SPARK_HOME of the installed pyspark (what ``find_spark_home`` prints)."""
    out = subprocess.run(
        [sys.executable, str(Path(sys.executable).parent / "find_spark_home.py")],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


@dataclass
class Proc:
    """A process the cluster started (the leader of its own process group) and its log."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill_group(self) -> None:
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait(30)

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _has_tag(pid: int, tag: bytes) -> bool:
    try:
        return tag in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


@dataclass
class StandaloneCluster:
    """Master + workers on 127.0.0.1 (1 core each), started with pyspark's ``bin/spark-class``."""

    base: Path
    tag: str = field(default_factory=lambda: uuid.uuid4().hex)
    master: Proc | None = None
    workers: list[Proc] = field(default_factory=list)
    drivers: list[Proc] = field(default_factory=list)
    port: int = 0
    ui_port: int = 0
    _started: int = 0

    def __post_init__(self) -> None:
        self.home = spark_home()
        self.base.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_"))}
        env.update(
            SPARK_HOME=str(self.home),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_LOG_DIR=str(self.base / "logs"),
            SPARK_DAEMON_MEMORY="256m",
            SLUICE_TEST_CLUSTER=self.tag,
            PYSPARK_PYTHON=sys.executable,
        )
        env.update(extra)
        return env

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str]) -> Proc:
        log = self.base / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            popen = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True, cwd=self.base,
            )  # fmt: skip
        return Proc(name, popen, log)

    def _class(self, cls: str, *args: str) -> list[str]:
        return [str(self.home / "bin" / "spark-class"), cls, *args]

    # -- the cluster -----------------------------------------------------------------------------------
    def start(self, workers: int = 2, limit_s: float = 180) -> StandaloneCluster:
        # port 0 everywhere: the OS picks free ports (no race with other processes picking the same), and
        # the master's log says which
        args = ["--host", "127.0.0.1", "--port", "0", "--webui-port", "0"]
        env = self.env(SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false")
        self.master = self._spawn("master", self._class("org.apache.spark.deploy.master.Master", *args), env)
        deadline = time.monotonic() + limit_s
        while not (self.port and self.ui_port):
            text = self.master.log.read_text(errors="replace")
            if m := re.search(r"Starting Spark master at spark://127\.0\.0\.1:(\d+)", text):
                self.port = int(m.group(1))
            if m := re.search(r"'MasterUI' on port (\d+)", text):
                self.ui_port = int(m.group(1))
            if not self.master.alive() or time.monotonic() > deadline:
                raise AssertionError(f"the master did not start:\n{self.master.log_tail()}")
            time.sleep(0.2)
        for _ in range(workers):
            self.start_worker()
        self.wait_workers(workers)
        return self

    def start_worker(self) -> Proc:
        i = self._started
        self._started += 1
        work = self.base / f"worker-{i}"
        work.mkdir(exist_ok=True)
        args = ["--host", "127.0.0.1", "--port", "0", "--webui-port", "0", "--cores", "1", "--memory", "1g"]
        args += ["--work-dir", str(work), self.url]
        w = self._spawn(f"worker-{i}", self._class("org.apache.spark.deploy.worker.Worker", *args), self.env())
        self.workers.append(w)
        return w

    def state(self) -> dict[str, Any]:
        """The master's JSON status (its web UI's ``/json/``)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=10) as r:
            return json.loads(r.read())  # type: ignore[no-any-return]

    def wait_workers(self, n: int, limit_s: float = 180) -> None:
        """Wait until ``n`` workers are ALIVE at the master (a generous limit, not a timing assertion)."""
        deadline = time.monotonic() + limit_s
        while True:
            assert self.master is not None
            if not self.master.alive():
                raise AssertionError(f"the master exited:\n{self.master.log_tail()}")
            try:
                alive = [w for w in self.state()["workers"] if w["state"] == "ALIVE"]
                if len(alive) >= n:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                tails = "\n".join(f"--- {p.name}\n{p.log_tail(20)}" for p in [self.master, *self.workers])
                raise AssertionError(f"{n} workers did not register within {limit_s}s\n{tails}")
            time.sleep(0.5)

    def kill_worker(self, w: Proc) -> None:
        """SIGKILL a worker's process group: the worker JVM and the executor JVMs it launched."""
        w.kill_group()
        self.workers.remove(w)

    # -- jobs ------------------------------------------------------------------------------------------
    def submit(self, name: str, script: str, *args: str, conf: dict[str, str] | None = None,
               env: dict[str, str] | None = None, archives: str | None = None) -> Proc:  # fmt: skip
        """``spark-submit`` (the venv's) in client mode against this cluster, in its own session."""
        settings = {
            "spark.executor.memory": "512m",
            "spark.executor.cores": "1",
            "spark.task.maxFailures": "1",
            "spark.ui.enabled": "false",
            "spark.dynamicAllocation.enabled": "false",
            **(conf or {}),
        }
        cmd = [str(Path(sys.executable).parent / "spark-submit"), "--master", self.url, "--name", name]
        if archives:
            cmd += ["--archives", archives]
        for k, v in settings.items():
            cmd += ["--conf", f"{k}={v}"]
        cmd += [script, *args]
        p = self._spawn(f"driver-{name}-{len(self.drivers)}", cmd, self.env(**(env or {})))
        self.drivers.append(p)
        return p

    def app_id(self, name: str) -> str | None:
        """The id of the running application ``name``, if the master lists it."""
        for app in self.state().get("activeapps", []):
            if app["name"] == name:
                return str(app["id"])
        return None

    def executors(self, app_id: str) -> list[int]:
        """PIDs of the executor JVMs (CoarseGrainedExecutorBackend) of application ``app_id``."""
        out = []
        for pid in self.tagged():
            cmd = _cmdline(pid)
            if "org.apache.spark.executor.CoarseGrainedExecutorBackend" in cmd and app_id in cmd:
                out.append(pid)
        return out

    # -- processes -------------------------------------------------------------------------------------
    def tagged(self) -> list[int]:
        """Every live process carrying this cluster's tag (master, workers, executors, Python workers)."""
        tag = f"SLUICE_TEST_CLUSTER={self.tag}".encode()
        return [
            int(d)
            for d in os.listdir("/proc")
            if d.isdigit() and int(d) != os.getpid() and _has_tag(int(d), tag) and not _is_zombie(int(d))
        ]

    def describe(self, pids: list[int]) -> str:
        return "\n".join(f"{pid}: {' '.join(_cmdline(pid))[:200]}" for pid in pids)

    def wait_gone(self, keep: set[int], limit_s: float = 60) -> list[int]:
        """Wait until no tagged process is left but ``keep``; returns those still there at the limit."""
        deadline = time.monotonic() + limit_s
        while True:
            left = [p for p in self.tagged() if p not in keep]
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.5)

    def daemons(self) -> set[int]:
        return {p.pid for p in [self.master, *self.workers] if p is not None and p.alive()}

    def stop(self) -> list[int]:
        """Kill every process group started here; returns the tagged processes left behind (orphans),
        which it then kills too so that a failing test leaves nothing running either."""
        for p in [*self.drivers, *self.workers, *([self.master] if self.master else [])]:
            p.kill_group()
        orphans = self.wait_gone(set(), limit_s=30)
        report = self.describe(orphans)
        for pid in orphans:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.orphan_report = report
        return orphans
