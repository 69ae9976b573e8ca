"""ruff and mypy are part of the test run: style and types are checked like behaviour."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(*cmd: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, **kw)  # type: ignore[call-overload]


def test_ruff() -> None:
    r = run(sys.executable, "-m", "ruff", "check", "core", "connectors", "sinks", "tests", "benchmarks")
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_strict_on_core(tmp_path: Path) -> None:
    # core/ is installed as `sluice`: give mypy the same view through a symlink
    (tmp_path / "sluice").symlink_to(ROOT / "core", target_is_directory=True)
    env = {**os.environ, "MYPYPATH": str(tmp_path)}
    r = run(sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir",
            str(tmp_path / ".mypy_cache"), "-p", "sluice", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
