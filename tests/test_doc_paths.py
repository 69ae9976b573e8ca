"""Test paths named in the README, docs/ and benchmarks/ exist: a moved test module cannot leave a stale name."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: ``tests/...`` not preceded by a path (``NAME/tests/test_source.py`` is a generated plugin's file)
TEST_PATH = re.compile(r"(?<![\w/.{-])tests/[\w./*-]*[\w*]")


def named_test_paths() -> dict[str, set[str]]:
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "benchmarks").glob("*.py"))]
    named: dict[str, set[str]] = {}
    for text in texts:
        for path in TEST_PATH.findall(text.read_text()):
            named.setdefault(path, set()).add(str(text.relative_to(ROOT)))
    return named


def test_every_test_path_named_in_the_docs_exists() -> None:
    named = named_test_paths()
    assert "tests/faults/test_exactly_once.py" in named, "the pattern finds no test path at all"
    missing = {
        path: sorted(where)
        for path, where in named.items()
        if not any(ROOT.glob(path)) and not (ROOT / f"{path}.py").exists()  # a module named without .py
    }
    assert not missing, f"test paths named in docs that do not exist (moved? renamed?): {missing}"
