"""``sluice new NAME --template source|sink`` makes plugin packages that install and pass their own tests.

sluice is published as ``sluice-etl`` (the package index's ``sluice`` is an unrelated 2015 ZFS tool), so a
generated plugin must depend on ``sluice-etl``. The default run makes a new virtualenv with the session's
sluice wheel (its dependencies linked from this environment, :mod:`tests.fresh_venv`), then
``pip install -e 'plugin[test]'`` there with ``--no-index --find-links <the wheel's folder>``: nothing can
come from the index, so a plugin that asked for ``sluice`` would fail to install; the installed distribution
is checked by name, and the plugins' generated tests run there. ``-m soak`` does it the long way: every
dependency of the wheel installed from the package index into a fresh venv.
"""

from __future__ import annotations

import venv
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from sluice.cli import main

from tests.fresh_venv import dependencies, installed_sluice, new_venv, run

ROOT = Path(__file__).resolve().parents[2]


def _scaffold(tmp_path: Path) -> list[Path]:
    made = []
    for kind, name in (("source", "lines-demo"), ("sink", "jsonl-demo")):
        r = CliRunner().invoke(main, ["new", name, "--template", kind, "--dir", str(tmp_path)])
        assert r.exit_code == 0, r.output
        assert f"created the {kind} plugin package" in r.output
        made.append(tmp_path / name)
    return made


_run = run


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


def test_job_and_plugin_names_follow_one_rule(tmp_path: Path) -> None:
    def new(name: str, template: str) -> tuple[int, str]:
        r = CliRunner().invoke(main, ["new", name, "--template", template, "--dir", str(tmp_path)])
        return r.exit_code, r.output

    # `_` is accepted by both: a job becomes a module name, a plugin a normalized distribution name
    assert new("Http_Poll", "sink")[0] == 0
    assert (tmp_path / "http-poll" / "src" / "sluice_http_poll" / "sink.py").is_file()
    assert 'name = "sluice-http-poll"' in (tmp_path / "http-poll" / "pyproject.toml").read_text()
    assert new("my_job-2", "kafka-to-parquet")[0] == 0 and (tmp_path / "my_job_2.py").is_file()
    # and both refuse the same names with the same one-line message
    for bad in ("9lives", "bad name", "trailing-", "_private", "a--b"):
        for template in ("kafka-to-parquet", "source"):
            code, out = new(bad, template)
            assert code != 0 and "must be words of letters and digits joined by - or _" in out, (bad, out)
            assert len(out.strip().splitlines()) == 1, out
    # no plugin may take sluice's own distribution name
    code, out = new("etl", "source")
    assert code != 0 and "sluice-etl, sluice's own distribution" in out, out


@pytest.fixture(scope="module")
def linked_dependencies(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield dependencies(tmp_path_factory.mktemp("deps") / "site")


def _check_installed(python: Path, cwd: Path) -> None:
    got = installed_sluice(python, cwd)
    assert got["provides"] == ["sluice-etl"] and got["sluice"] is None, got
    assert got["file"].startswith(got["prefix"]), f"sluice imported from outside the new venv: {got}"


def test_plugin_depends_on_sluice_etl(tmp_path: Path) -> None:
    source, sink = _scaffold(tmp_path)
    # sluice-etl is not on the package index: the printed commands install it from where this one came from
    r = CliRunner().invoke(main, ["new", "other", "--template", "sink", "--dir", str(tmp_path)])
    assert f".venv/bin/pip install {ROOT} && .venv/bin/pip install -e '.[test]'" in r.output, r.output
    for pkg in (source, sink):
        text = (pkg / "pyproject.toml").read_text()
        assert 'dependencies = ["sluice-etl>=0.1.0"]' in text, text
        assert "pypi.org/project/sluice-etl/" in (pkg / "README.md").read_text()


def test_generated_plugin_installs_and_passes_its_tests_in_a_new_venv(
    tmp_path: Path, sluice_wheel: Path, linked_dependencies: Path
) -> None:
    packages = _scaffold(tmp_path)
    python = new_venv(tmp_path / "venv", sluice_wheel, linked_dependencies)
    _check_installed(python, tmp_path)
    for pkg in packages:
        # --no-index: only the wheel's folder; a plugin asking for a distribution named "sluice" fails here
        _run(
            [str(python), "-m", "pip", "install", "-q", "--no-index", "--find-links", str(sluice_wheel.parent),
             "--no-build-isolation", "-e", f"{pkg}[test]"],
            tmp_path,
        )  # fmt: skip
    _check_installed(python, tmp_path)
    # every contract of the kit ran: 9 source checks + the entry point; 11 sink checks + the entry point
    # (the global-commit check does not apply to a per-subtask committer)
    for pkg, summary in zip(packages, ("10 passed", "11 passed, 1 skipped"), strict=True):
        out = _run([str(python), "-m", "pytest", "-p", "no:cacheprovider", "-q", str(pkg / "tests")], pkg)
        assert summary in out and "failed" not in out, out
    # the plugins are installed in the new venv only: this environment does not see them
    from importlib.metadata import entry_points

    assert "lines-demo" not in {ep.name for ep in entry_points(group="sluice.connectors")}


@pytest.mark.soak
def test_generated_plugin_tests_pass_in_a_fresh_venv_from_the_index(tmp_path: Path, sluice_wheel: Path) -> None:
    packages = _scaffold(tmp_path)
    env_dir = tmp_path / "fresh"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    links = ["--find-links", str(sluice_wheel.parent)]
    # sluice's dependencies from the index; sluice-etl itself only from the wheel's folder (it is not on the
    # index, and must never be confused with the index's "sluice")
    _run([str(python), "-m", "pip", "install", "-q", *links, "sluice-etl"], tmp_path, timeout=1800)
    for pkg in packages:
        _run([str(python), "-m", "pip", "install", "-q", *links, "-e", f"{pkg}[test]"], tmp_path, timeout=900)
        out = _run([str(python), "-m", "pytest", "-p", "no:cacheprovider", "-q"], pkg)
        assert " passed" in out and "failed" not in out, out
    _check_installed(python, tmp_path)
