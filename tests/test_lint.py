"""ruff and mypy are part of the test run: style and types are checked like behaviour."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE_ROOTS = ("core", "connectors", "sinks", "templates")


def run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff() -> None:
    r = run(sys.executable, "-m", "ruff", "check", *SOURCE_ROOTS, "tests", "benchmarks")
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_strict_on_every_source_root(tmp_path: Path) -> None:
    # pyproject.toml's [tool.mypy] names the source roots (mypy_path) and the files: core, connectors,
    # sinks and templates, strict for every `sluice.*` module
    r = run(sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir",
            str(tmp_path / ".mypy_cache"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Success" in r.stdout and "source files" in r.stdout, r.stdout
