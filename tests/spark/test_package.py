"""Only ``sluice.runtime.spark`` imports pyspark; the rest of sluice runs without loading it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = ("core", "connectors", "sinks", "templates")
SPARK_PACKAGE = ROOT / "core" / "sluice" / "runtime" / "spark"


def _imports_pyspark(path: Path) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        if any(n == "pyspark" or n.startswith("pyspark.") for n in names):
            lines.append(node.lineno)
    return lines


def test_only_the_spark_package_imports_pyspark() -> None:
    found = {
        str(p.relative_to(ROOT)): lines
        for root in SOURCE_ROOTS
        for p in sorted((ROOT / root).rglob("*.py"))
        if (lines := _imports_pyspark(p))
    }
    outside = {p: lines for p, lines in found.items() if not (ROOT / p).is_relative_to(SPARK_PACKAGE)}
    assert not outside, f"pyspark imported outside sluice.runtime.spark: {outside}"
    assert found, "the Spark package imports pyspark nowhere: the check sees nothing"


def test_sluice_runs_locally_without_loading_pyspark() -> None:
    code = (
        "import sys, sluice, sluice.api, sluice.cli, sluice.runtime.local, sluice.runtime.spark, "
        "sluice.connectors.generator, sluice.connectors.kafka, sluice.sinks.files, sluice.sinks.testing\n"
        "assert 'pyspark' not in sys.modules, sorted(m for m in sys.modules if m.startswith('pyspark'))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
