"""``sluice new NAME --template source|sink`` makes plugin packages whose own tests pass as generated.

The default run installs the generated packages into a new virtual environment that sees this
environment's packages (a ``.pth`` file runs ``site.addsitedir`` on our site-packages, so sluice and its
dependencies are not downloaded again) with ``pip install --no-deps --no-build-isolation``, then runs
their tests there in a subprocess: the package builds, its entry point registers, its conformance tests
pass. ``-m soak`` does it the long way: a fresh venv, ``pip install`` of this checkout and of the package
with its test extra, from the package index.
"""

from __future__ import annotations

import os
import subprocess
import sysconfig
import venv
from pathlib import Path

import pytest
from click.testing import CliRunner
from sluice.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _scaffold(tmp_path: Path) -> list[Path]:
    made = []
    for kind, name in (("source", "lines-demo"), ("sink", "jsonl-demo")):
        r = CliRunner().invoke(main, ["new", name, "--template", kind, "--dir", str(tmp_path)])
        assert r.exit_code == 0, r.output
        assert f"created the {kind} plugin package" in r.output
        made.append(tmp_path / name)
    return made


def _run(cmd: list[str], cwd: Path, timeout: float = 600) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return r.stdout


def test_generated_packages_have_the_promised_layout(tmp_path: Path) -> None:
    source, sink = _scaffold(tmp_path)
    assert sorted(str(p.relative_to(source)) for p in source.rglob("*") if p.is_file()) == [
        "README.md", "pyproject.toml", "src/sluice_lines_demo/__init__.py", "src/sluice_lines_demo/source.py",
        "tests/test_source.py",
    ]
    assert '[project.entry-points."sluice.connectors"]\nlines-demo = "sluice_lines_demo.source:LinesDemoSource"' in (
        source / "pyproject.toml"
    ).read_text()
    assert '[project.entry-points."sluice.sinks"]\njsonl-demo = "sluice_jsonl_demo.sink:JsonlDemoSink"' in (
        sink / "pyproject.toml"
    ).read_text()
    assert "SinkConformance" in (sink / "tests" / "test_sink.py").read_text()
    r = CliRunner().invoke(main, ["new", "lines-demo", "--template", "source", "--dir", str(tmp_path)])
    assert r.exit_code != 0 and "exists" in r.output
    r = CliRunner().invoke(main, ["new", "Bad_Name", "--template", "sink", "--dir", str(tmp_path)])
    assert r.exit_code != 0 and "must be a plugin name" in r.output


def test_generated_plugin_tests_pass_in_a_new_venv(tmp_path: Path) -> None:
    packages = _scaffold(tmp_path)
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site_dir = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path).strip())
    ours = sysconfig.get_paths()["purelib"]
    (site_dir / "_sluice_test_parent.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    for pkg in packages:
        _run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", str(pkg)], tmp_path)
    # every contract of the kit ran: 9 source checks + the entry point; 11 sink checks + the entry point
    # (the global-commit check does not apply to a per-subtask committer)
    for pkg, summary in zip(packages, ("10 passed", "11 passed, 1 skipped"), strict=True):
        out = _run([str(python), "-m", "pytest", "-p", "no:cacheprovider", "-q", str(pkg / "tests")], pkg)
        assert summary in out and "failed" not in out, out
    # the plugins are installed in the new venv only: this environment does not see them
    from importlib.metadata import entry_points

    assert "lines-demo" not in {ep.name for ep in entry_points(group="sluice.connectors")}


@pytest.mark.soak
def test_generated_plugin_tests_pass_in_a_fresh_venv_from_the_index(tmp_path: Path) -> None:
    packages = _scaffold(tmp_path)
    env_dir = tmp_path / "fresh"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = str(env_dir / "bin" / "python")
    _run([python, "-m", "pip", "install", "-q", str(ROOT)], tmp_path, timeout=1800)
    for pkg in packages:
        _run([python, "-m", "pip", "install", "-q", f"{pkg}[test]"], tmp_path, timeout=900)
        out = _run([python, "-m", "pytest", "-p", "no:cacheprovider", "-q"], pkg)
        assert " passed" in out and "failed" not in out, out
