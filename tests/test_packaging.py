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
    # the native Kafka reader (native/, built by setuptools-rust where cargo is: it is here), stable ABI
    assert "sluice/connectors/kafka/_native.abi3.so" in names, [n for n in names if "kafka/_" in n]
    assert wheel.name.endswith("-cp311-abi3-linux_x86_64.whl"), wheel.name
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


_NO_NATIVE_PROBE = """
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
from sluice.connectors.kafka import KafkaSource
from sluice.connectors.kafka.native_reader import NativeKafkaSourceReader
from sluice.errors import ConfigError
reader = KafkaSource("localhost:9092", "t").create_reader(None)
assert not isinstance(reader, NativeKafkaSourceReader), type(reader)
try:
    KafkaSource("localhost:9092", "t", reader="native").validate()
except ConfigError as exc:
    print("REFUSED", exc)
"""


def test_without_cargo_the_wheel_is_pure_python_and_the_kafka_source_reads_with_python(tmp_path: Path) -> None:
    """A machine without Rust: the install goes on (no extension, a py3-none-any wheel), ``reader="auto"``
    takes today's reader and says why, ``reader="native"`` is refused in one line."""
    from tests.conftest import clean_source_copy
    from tests.fresh_venv import dependencies, new_venv, run

    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "cargo").exists())
    dist = tmp_path / "dist"
    src = clean_source_copy(tmp_path / "src")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)], tmp_path,
        env={"PATH": path})  # fmt: skip
    (wheel,) = dist.glob("sluice_etl-*.whl")
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name
    assert not [n for n in zipfile.ZipFile(wheel).namelist() if "_native" in n and not n.endswith(".pyi")]
    python = new_venv(tmp_path / "venv", wheel, dependencies(tmp_path / "deps"))
    out = run([str(python), "-c", _NO_NATIVE_PROBE], tmp_path)
    assert "KafkaSource 'kafka': python reader (the native reader cannot run: the extension" in out, out
    (refused,) = [line for line in out.splitlines() if line.startswith("REFUSED")]
    assert "reader='native' cannot run: the extension sluice.connectors.kafka._native is not built" in refused
