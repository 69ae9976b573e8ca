"""The shape ARCHITECTURE.md section 1 asks for: paths are module paths, modules stay small."""

from __future__ import annotations

import inspect
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE_ROOTS = ("core", "connectors", "sinks", "templates")
MAX_LINES = 450


def test_no_source_module_over_450_lines() -> None:
    big = {
        str(p.relative_to(ROOT)): n
        for root in SOURCE_ROOTS
        for p in (ROOT / root / "sluice").rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not big, f"modules over {MAX_LINES} lines (split them by role): {big}"


def test_every_source_root_holds_only_its_namespace() -> None:
    expected = {"core": "sluice", "connectors": "sluice/connectors", "sinks": "sluice/sinks", "templates": "sluice/templates"}
    for root, package in expected.items():
        assert (ROOT / root / package / "__init__.py").is_file(), f"{root}/{package}/__init__.py is missing"
        strays = [p.name for p in (ROOT / root).iterdir() if p.name not in ("sluice", "__pycache__")]
        assert not strays, f"{root}/ holds files outside its source root: {strays}"
    for root in ("connectors", "sinks", "templates"):
        assert not (ROOT / root / "sluice" / "__init__.py").exists(), f"{root}/sluice must stay a namespace portion"


def test_task_takes_at_most_six_parameters() -> None:
    from sluice.runtime.task import Task

    params = [p for p in inspect.signature(Task.__init__).parameters if p != "self"]
    assert len(params) <= 6, params
