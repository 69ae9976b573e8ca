"""A new virtualenv with sluice installed from the session's wheel, in seconds and without the package index.

Installing sluice's dependencies (pyspark alone is ~500 MB unpacked) into every new virtualenv would take
minutes, so :func:`new_venv` makes one that sees them through a folder of links (:func:`dependencies`) to
this environment's site-packages *without sluice itself* (neither its editable-install hook nor its
metadata), then installs the sluice wheel there with ``--no-index``: pip resolves sluice-etl's
requirements against the linked packages, and nothing can come from the package index.
"""

from __future__ import annotations

import json
import os
import subprocess
import sysconfig
import venv
from pathlib import Path

__all__ = ["dependencies", "installed_sluice", "new_venv", "run"]


def run(cmd: list[str], cwd: Path, timeout: float = 600, env: dict[str, str] | None = None) -> str:
    """Run ``cmd``; fail the test with its output if it fails; return its stdout."""
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env={**base, **(env or {})})
    assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return r.stdout


def dependencies(dest: Path) -> Path:
    """``dest``, filled with links to every entry of this environment's site-packages except sluice's."""
    dest.mkdir(parents=True, exist_ok=True)
    ours = Path(sysconfig.get_paths()["purelib"])
    for entry in ours.iterdir():
        # sluice's package, metadata and editable-install hook (``__editable__.sluice_etl-*.pth``, its finder)
        if "sluice" not in entry.name.lower() and entry.name != "__pycache__":
            (dest / entry.name).symlink_to(entry)
    return dest


def new_venv(path: Path, wheel: Path, deps: Path) -> Path:
    """A virtualenv at ``path`` that sees ``deps`` (a ``.pth`` file runs ``site.addsitedir``, so their own
    ``.pth`` files work too) and has the sluice ``wheel`` installed from its folder only. Returns its Python."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(path)
    python = path / "bin" / "python"
    site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], path).strip())
    (site / "_sluice_test_dependencies.pth").write_text(f"import site; site.addsitedir({str(deps)!r})\n")
    # pip comes from the linked folder and installs into this virtualenv (sys.prefix of its interpreter)
    run(
        [str(python), "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheel.parent), "sluice-etl"],
        path,
    )
    return python


def installed_sluice(python: Path, cwd: Path) -> dict[str, str]:
    """What provides ``import sluice`` in the environment of ``python``: its distributions and its file."""
    probe = (
        "import importlib.metadata as m, json, sluice\n"
        "provides = sorted(m.packages_distributions().get('sluice', []))\n"
        "def version(name):\n"
        "    try:\n"
        "        return m.version(name)\n"
        "    except m.PackageNotFoundError:\n"
        "        return None\n"
        "print(json.dumps({'provides': provides, 'sluice': version('sluice'), 'sluice-etl': version('sluice-etl'),"
        " 'file': sluice.__file__, 'prefix': __import__('sys').prefix}))\n"
    )
    out: dict[str, str] = json.loads(run([str(python), "-c", probe], cwd))
    return out
