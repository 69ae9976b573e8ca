"""``sluice package``: the job's virtualenv packed with venv-pack, and the spark-submit line that ships it.

The cheap half of the shipping test: a small virtualenv with sluice installed from its wheel (without its
dependencies) is packed, unpacked elsewhere and imports sluice from the unpacked copy. The end-to-end run
on a standalone cluster, with every dependency, is tests/cluster/test_shipped_env.py (``-m cluster``).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SLUICE = str(Path(sys.executable).parent / "sluice")


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SLUICE, "package", *args], capture_output=True, text=True, timeout=600, cwd=cwd)


@pytest.fixture(scope="module")
def small_venv(tmp_path_factory: pytest.TempPathFactory, sluice_wheel: Path) -> Path:
    """A virtualenv (no pip) with the sluice wheel built from this checkout, without its dependencies."""
    d = tmp_path_factory.mktemp("small-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(d / "env")], check=True, timeout=300)
    wheel = sluice_wheel
    (site,) = (d / "env").glob("lib/python3*/site-packages")
    # --target, not --prefix: pip would first uninstall the sluice of the environment it runs in
    r = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site), str(wheel)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    return d / "env"


def test_packs_a_virtualenv_and_prints_the_submit_line(small_venv: Path, tmp_path: Path) -> None:
    r = _run("--venv", str(small_venv), "-o", "env.tar.gz", "--master", "spark://m:7077", "my_job.py", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    archive = tmp_path / "env.tar.gz"
    assert shlex.split(r.stdout.strip()) == [
        f"PYSPARK_DRIVER_PYTHON={small_venv}/bin/python",
        "PYSPARK_PYTHON=./environment/bin/python",
        "spark-submit", "--master", "spark://m:7077", "--conf", "spark.dynamicAllocation.enabled=false",
        "--conf", "spark.task.maxFailures=1", "--archives", f"{archive}#environment", "my_job.py",
    ]  # fmt: skip
    # installed --no-deps: the missing requirements are named, with the command that installs them
    assert "lacks sluice's requirements pyarrow" in r.stderr and f"{small_venv}/bin/pip install" in r.stderr
    assert "executors need Python 3." in r.stderr
    with tarfile.open(archive) as t:
        names = set(t.getnames())
        assert {"bin/python", "pyvenv.cfg"} <= names
        assert any(n.endswith("site-packages/sluice/__init__.py") for n in names)
        t.extractall(tmp_path / "unpacked", filter="tar")
    # unpacked somewhere else, the environment imports sluice from itself
    probe = "import importlib.util, sys; print(sys.prefix); print(importlib.util.find_spec('sluice').origin)"
    got = subprocess.run(
        [str(tmp_path / "unpacked" / "bin" / "python"), "-c", probe], capture_output=True, text=True, timeout=60
    )
    assert got.returncode == 0, got.stderr
    prefix, origin = got.stdout.split()
    assert Path(prefix) == tmp_path / "unpacked" and origin.startswith(str(tmp_path / "unpacked")), got.stdout
    # an existing archive is kept unless --force
    again = _run("--venv", str(small_venv), "-o", "env.tar.gz", cwd=tmp_path)
    assert again.returncode != 0 and "already exists" in again.stderr
    assert _run("--venv", str(small_venv), "-o", "env.tar.gz", "--force", cwd=tmp_path).returncode == 0


def test_refuses_editable_installs(tmp_path: Path) -> None:
    # this checkout's virtualenv has sluice installed with `pip install -e` (a PEP 660 import hook, which
    # venv-pack itself lets through): executors would be sent to this machine's source tree
    r = _run("--venv", sys.prefix, "-o", "env.tar.gz", cwd=tmp_path)
    assert r.returncode != 0
    assert "has editable installs: sluice-etl (file://" in r.stderr and "without -e" in r.stderr
    assert not (tmp_path / "env.tar.gz").exists()


def test_refuses_what_is_no_job_environment(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True, timeout=300)
    r = _run("--venv", str(tmp_path / "bare"), cwd=tmp_path)
    assert r.returncode != 0 and "sluice is not installed in" in r.stderr
    # the distribution's name, not the package index's unrelated "sluice"
    assert "/bin/pip install sluice-etl, then try again" in r.stderr, r.stderr
    r = _run("--venv", str(tmp_path), cwd=tmp_path)
    assert r.returncode != 0 and "is not a virtualenv" in r.stderr
