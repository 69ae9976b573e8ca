"""``sluice package``: pack the job's virtual environment for Spark executors with venv-pack.

Executors run the job's code, so they need sluice and the job's dependencies. ``sluice package`` packs a
virtualenv (the one it runs in, or ``--venv``) into an archive that ``spark-submit --archives
env.tar.gz#environment`` unpacks in every executor's working directory, and prints the spark-submit line
that uses it (``PYSPARK_PYTHON=./environment/bin/python``).

What it checks first, because venv-pack does not (or not fully):

* **editable installs** (``pip install -e``): venv-pack refuses only those that a ``.pth`` file points to
  by path; a PEP 660 editable install (setuptools' default: an import hook) slips through, and the archive
  would send executors to this machine's source tree. sluice refuses both (PEP 610 ``direct_url.json``):
  install such packages normally (``pip install .`` or a wheel) in the environment you ship.
* sluice itself must be installed there, and its requirements (a warning names the missing ones).

pyspark is left out by default (``--with-pyspark`` keeps it): Spark puts its own ``pyspark.zip`` ahead of
the environment on every executor's ``PYTHONPATH`` (standalone and YARN ship it, Kubernetes images have
it), so the ~500 MB copy would never be imported there. venv-pack does not pack the Python interpreter:
executors need the environment's base Python at the same path (or ``--python-prefix``).
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from importlib.metadata import Distribution, distributions
from pathlib import Path

import click

from sluice.cli.main import main

__all__ = ["DISTRIBUTION", "PackageError", "editable_installs", "missing_requirements", "package", "submit_line"]

#: sluice's distribution name on the package index (the import name is ``sluice``; the index's ``sluice`` is
#: another project)
DISTRIBUTION = "sluice-etl"

#: what spark-submit's ``--archives`` gets and the directory executors see it in
ARCHIVE_DIR = "environment"


class PackageError(click.ClickException):
    """The environment cannot be shipped as it is; the message says what to change."""


def _site_packages(prefix: Path) -> Path:
    found = sorted(prefix.glob("lib/python3*/site-packages"))
    if not found:
        raise PackageError(f"{prefix} has no lib/python3.*/site-packages: is it a virtualenv?")
    return found[0]


def _dists(site: Path) -> list[Distribution]:
    return list(distributions(path=[str(site)]))


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def editable_installs(site: Path) -> dict[str, str]:
    """Distributions installed in editable mode (PEP 610 ``direct_url.json``), by name, with their source."""
    out = {}
    for d in _dists(site):
        raw = d.read_text("direct_url.json")
        if not raw:
            continue
        try:
            info = json.loads(raw)
        except ValueError:
            continue
        if info.get("dir_info", {}).get("editable"):
            out[d.metadata["Name"]] = str(info.get("url", "?"))
    return out


def missing_requirements(site: Path, name: str = DISTRIBUTION) -> list[str]:
    """Requirements of ``name`` (without extras) that are not installed in ``site``."""
    dists = {_norm(d.metadata["Name"]): d for d in _dists(site)}
    top = dists.get(_norm(name))
    if top is None:
        return [name]
    missing = []
    for req in top.requires or []:
        if "extra ==" in req.replace('"', "").replace("'", ""):
            continue
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
        if m and _norm(m.group(1)) not in dists:
            missing.append(m.group(1))
    return missing


def submit_line(archive: Path, driver_python: str, job: str, master: str | None) -> str:
    """The spark-submit command (client deploy mode) that runs ``job`` with executors on ``archive``."""
    parts = [f"PYSPARK_DRIVER_PYTHON={shlex.quote(driver_python)}", f"PYSPARK_PYTHON=./{ARCHIVE_DIR}/bin/python"]
    parts += ["spark-submit"]
    if master:
        parts += ["--master", shlex.quote(master)]
    # every recipe needs both (docs/spark.md): sluice recovers from its checkpoints, not Spark's retries
    parts += ["--conf", "spark.dynamicAllocation.enabled=false", "--conf", "spark.task.maxFailures=1"]
    parts += ["--archives", shlex.quote(f"{archive}#{ARCHIVE_DIR}"), shlex.quote(job)]
    return " ".join(parts)


def _venv_cfg(prefix: Path) -> dict[str, str]:
    """pyvenv.cfg as a dict (``home``: the base Python's bin directory, ``version``)."""
    out = {}
    for line in (prefix / "pyvenv.cfg").read_text().splitlines():
        key, _, value = line.partition("=")
        out[key.strip().lower()] = value.strip()
    return out


@main.command()
@click.argument("job", required=False, default="job.py")
@click.option(
    "--venv",
    "venv",
    type=click.Path(file_okay=False, exists=True),
    default=None,
    help="The virtualenv to pack (default: the one sluice runs in).",
)
@click.option("-o", "--output", default="env.tar.gz", show_default=True, help="Archive to write (.tar.gz, .zip).")
@click.option("--master", default=None, help="Spark master URL to put in the printed spark-submit line.")
@click.option("--with-pyspark", is_flag=True, help="Keep pyspark in the archive (executors use Spark's own).")
@click.option(
    "--python-prefix",
    default=None,
    help="Where the executors' base Python lives, if not at the environment's base Python's path.",
)
@click.option("--compress-level", type=click.IntRange(0, 9), default=4, show_default=True)
@click.option("--force", is_flag=True, help="Overwrite the archive if it exists.")
def package(
    job: str,
    venv: str | None,
    output: str,
    master: str | None,
    with_pyspark: bool,
    python_prefix: str | None,
    compress_level: int,
    force: bool,
) -> None:
    """Pack the job's virtualenv for Spark executors (venv-pack) and print the spark-submit line.

    JOB is the job file named in the printed line (default job.py).
    """
    import venv_pack

    prefix = Path(venv).resolve() if venv else Path(sys.prefix)
    if not (prefix / "pyvenv.cfg").is_file():
        raise PackageError(
            f"{prefix} is not a virtualenv: run `sluice package` with the job's virtualenv's sluice, or pass "
            "--venv PATH (python -m venv env && env/bin/pip install sluice-etl <your dependencies>)"
        )
    site = _site_packages(prefix)
    editable = editable_installs(site)
    if editable:
        names = ", ".join(f"{n} ({url})" for n, url in sorted(editable.items()))
        raise PackageError(
            f"{prefix} has editable installs: {names}; executors would look for their source on this "
            "machine's paths. Install them normally in the environment you ship "
            "(pip install --force-reinstall --no-deps <path or wheel>, without -e), then run sluice package again"
        )
    missing = missing_requirements(site)
    if missing == [DISTRIBUTION]:
        raise PackageError(
            f"sluice is not installed in {prefix}: {prefix}/bin/pip install {DISTRIBUTION}, then try again"
        )
    if missing:
        click.echo(
            f"warning: {prefix} lacks sluice's requirements {', '.join(missing)}: executors will fail to "
            f"import them ({prefix}/bin/pip install {' '.join(missing)})",
            err=True,
        )
    env = venv_pack.Env(str(prefix))
    if not with_pyspark:
        env = env.exclude(f"{site.relative_to(prefix)}/pyspark/*").exclude(f"{site.relative_to(prefix)}/pyspark-*")
    out = Path(output).resolve()
    try:
        env.pack(output=str(out), compress_level=compress_level, force=force, python_prefix=python_prefix)
    except venv_pack.VenvPackException as exc:
        raise PackageError(f"venv-pack could not pack {prefix}: {exc}") from exc
    size = out.stat().st_size / 1e6
    click.echo(f"packed {prefix} into {out} ({size:.0f} MB)", err=True)
    cfg = _venv_cfg(prefix)
    base = python_prefix or cfg.get("home", "?")
    click.echo(
        f"executors need Python {cfg.get('version', cfg.get('version_info', '?'))} at {base} "
        "(venv-pack does not pack the interpreter; --python-prefix names another path)",
        err=True,
    )
    click.echo(submit_line(out, str(prefix / "bin" / "python"), job, master))
