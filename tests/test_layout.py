"""The shape ARCHITECTURE.md section 1 asks for: paths are module paths, modules stay small."""

from __future__ import annotations

import inspect
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE_ROOTS = ("core", "connectors", "sinks", "templates")
#: the most lines a module of each source root may have
MAX_LINES = {"core": 400, "connectors": 400, "sinks": 400, "templates": 400}


def test_no_source_module_over_the_line_cap() -> None:
    big = {
        f"{p.relative_to(ROOT)} (cap {MAX_LINES[root]})": n
        for root in SOURCE_ROOTS
        for p in (ROOT / root / "sluice").rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES[root]
    }
    assert not big, f"modules over their root's line cap (split them by role): {big}"


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


def test_ci_runs_the_readmes_two_commands_test_command_verbatim() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = [b.split("```", 1)[0].strip() for b in readme.split("```bash\n")[1:]]
    test_command = next(b for b in blocks if "pytest" in b and "\n" not in b)
    ci_lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci_lines[-1] == test_command, (ci_lines[-1], test_command)
