"""The wheel holds every module: packages are discovered over the source roots, never listed by hand."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE_ROOTS = ("core", "connectors", "sinks", "templates")

_IMPORT_ALL = """
import importlib, pkgutil, sys
import sluice
where = sys.argv[1]
names = sorted(m.name for m in pkgutil.walk_packages(sluice.__path__, "sluice."))
for name in names:
    mod = importlib.import_module(name)
    assert (mod.__file__ or "").startswith(where), f"{name} imported from {mod.__file__}, not the wheel"
print(len(names), "modules")
"""


def _source_modules() -> set[str]:
    """Every module under the source roots, by its module path (``core/sluice/a/b.py`` -> ``sluice.a.b``)."""
    out = set()
    for root in SOURCE_ROOTS:
        for path in (ROOT / root / "sluice").rglob("*.py"):
            rel = path.relative_to(ROOT / root).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            out.add(".".join(parts))
    return out


def test_wheel_contains_and_imports_every_module(tmp_path: Path, sluice_wheel: Path) -> None:
    wheel = sluice_wheel
    unpacked = tmp_path / "unpacked"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(unpacked)
        in_wheel = {
            n[:-3].replace("/", ".").removesuffix(".__init__") for n in z.namelist() if n.endswith(".py")
        }
    assert _source_modules() <= in_wheel, f"missing from the wheel: {sorted(_source_modules() - in_wheel)}"
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.endswith(".j2") for n in names), "templates are package data"
    for kind in ("source", "sink"):  # the plugin templates of `sluice new --template source|sink`
        assert f"sluice/templates/plugins/{kind}/{kind}.py.j2" in names, f"plugin template {kind} missing"
    for asset in ("dashboard.html", "dashboard.js", "dashboard.css", "login.html"):  # the dashboard's files
        assert f"sluice/control/static/{asset}" in names, asset
    # -S: no site processing, so the editable install's import hook is not active; dependencies come from
    # this environment's site-packages, sluice only from the unpacked wheel
    site_packages = sysconfig.get_paths()["purelib"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(unpacked), site_packages])}
    r = subprocess.run(
        [sys.executable, "-S", "-c", _IMPORT_ALL, str(unpacked)],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert int(r.stdout.split()[0]) >= len(_source_modules()) - 1, r.stdout
