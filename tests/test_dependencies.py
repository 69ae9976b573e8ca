"""The dependency direction of ARCHITECTURE.md section 1, kept by a test.

* the core (``core/sluice``) never imports ``sluice.connectors``, ``sluice.sinks`` or ``sluice.templates``;
* connectors and sinks do not import each other;
* only the Spark runtime subpackage imports pyspark;
* production code never imports the test machinery (``sluice.testing``); the engine knows fault injection
  only through ``sluice.runtime.fault_hook``.

Imports are read from the source (``import``/``from`` statements anywhere, lazy ones in functions too).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROOTS = {"core": ROOT / "core", "connectors": ROOT / "connectors", "sinks": ROOT / "sinks", "templates": ROOT / "templates"}
SPARK_PACKAGE = "sluice.runtime.spark"


def modules() -> dict[str, tuple[str, set[str]]]:
    """Every source module: name -> (source root, imported module names)."""
    out: dict[str, tuple[str, set[str]]] = {}
    for root, base in ROOTS.items():
        for path in (base / "sluice").rglob("*.py"):
            rel = path.relative_to(base).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            name = ".".join(parts)
            imported: set[str] = set()
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    imported.update(a.name for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    imported.add(node.module)
                    imported.update(f"{node.module}.{a.name}" for a in node.names)
            out[name] = (root, imported)
    return out


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def violations(rule: str) -> list[str]:
    bad = []
    for name, (root, imported) in sorted(modules().items()):
        for imp in sorted(imported):
            if rule == "core" and root == "core" and any(
                _under(imp, p) for p in ("sluice.connectors", "sluice.sinks", "sluice.templates")
            ):
                bad.append(f"{name} imports {imp}")
            if rule == "siblings" and (
                (root == "connectors" and _under(imp, "sluice.sinks"))
                or (root == "sinks" and _under(imp, "sluice.connectors"))
            ):
                bad.append(f"{name} imports {imp}")
            if rule == "pyspark" and _under(imp, "pyspark") and not _under(name, SPARK_PACKAGE):
                bad.append(f"{name} imports {imp}")
            if rule == "testing" and _under(imp, "sluice.testing") and not _under(name, "sluice.testing"):
                bad.append(f"{name} imports {imp}")
    return bad


def test_sources_are_found() -> None:
    found = modules()
    assert {"sluice.api", "sluice.connectors.kafka", "sluice.sinks.files", "sluice.templates"} <= set(found)


def test_core_never_imports_connectors_sinks_or_templates() -> None:
    assert violations("core") == []


def test_connectors_and_sinks_do_not_import_each_other() -> None:
    assert violations("siblings") == []


def test_only_the_spark_runtime_imports_pyspark() -> None:
    assert violations("pyspark") == []


def test_production_code_never_imports_the_test_machinery() -> None:
    assert violations("testing") == []


def test_the_rules_catch_a_violation(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A module that breaks each rule is reported (the checks are not vacuous)."""
    fake = tmp_path / "core" / "sluice"
    fake.mkdir(parents=True)
    (fake / "bad.py").write_text(
        "def f():\n    import pyspark\n    from sluice.sinks.files import FileSink\n    import sluice.testing.faults\n"
    )
    monkeypatch.setitem(ROOTS, "core", tmp_path / "core")
    assert violations("core") == ["sluice.bad imports sluice.sinks.files", "sluice.bad imports sluice.sinks.files.FileSink"]
    assert violations("pyspark") and violations("testing")


def test_sluice_runs_locally_without_loading_pyspark() -> None:
    import subprocess
    import sys

    code = (
        "import sys, sluice, sluice.api, sluice.cli, sluice.runtime.local, sluice.runtime.spark, "
        "sluice.connectors.generator, sluice.connectors.kafka, sluice.sinks.files, sluice.sinks.testing\n"
        "assert 'pyspark' not in sys.modules, sorted(m for m in sys.modules if m.startswith('pyspark'))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
