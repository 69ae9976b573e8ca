"""Where the sinks stand in the import graph (issue 23 points 4 and 5): on the SPI, errors, config helpers
and the neutral :mod:`sluice.io` only, with no import circle between their modules; ``sluice.io`` is a leaf.

Every import counts: top-level, in functions, under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SINKS = ROOT / "sinks"
IO = ROOT / "core" / "sluice" / "io"
#: what a sink may import of the core
SINK_ALLOWED = (
    "sluice.sink",
    "sluice.serializers",
    "sluice.errors",
    "sluice.durations",  # one spelling of a duration everywhere: a leaf on sluice.errors
    "sluice.config",
    "sluice.io",
    "sluice.changes",  # the change model: a leaf the upsert sinks share with the change formats
    "sluice.sinks",
)


def _name(base: Path, path: Path) -> str:
    rel = path.relative_to(base).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def imports(base: Path, package: Path) -> dict[str, set[str]]:
    """module -> the ``sluice`` modules (or names in them) it imports."""
    out: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
        out[_name(base, path)] = {m for m in found if m == "sluice" or m.startswith("sluice.")}
    return out


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles (strongly connected components of more than one module) of ``graph``, whose edges
    name modules or names in them (``a.b.C`` counts as ``a.b``)."""
    nodes = set(graph)
    edges = {m: {t if t in nodes else t.rsplit(".", 1)[0] for t in targets} & nodes for m, targets in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v] - {v}:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def test_sinks_import_only_the_spi_errors_config_and_neutral_io() -> None:
    bad = [
        f"{module} imports {name}"
        for module, names in imports(SINKS, SINKS / "sluice").items()
        for name in sorted(names)
        if not any(_under(name, allowed) for allowed in SINK_ALLOWED)
    ]
    assert not bad, bad


def test_durations_are_a_leaf() -> None:
    bad = [
        f"{module} imports {name}"
        for module, names in imports(ROOT / "core", ROOT / "core" / "sluice").items()
        if module == "sluice.durations"
        for name in sorted(names)
        if not _under(name, "sluice.errors")
    ]
    assert not bad, bad


def test_neutral_io_is_a_leaf() -> None:
    bad = [
        f"{module} imports {name}"
        for module, names in imports(ROOT / "core", IO).items()
        for name in sorted(names)
        if not (_under(name, "sluice.errors") or _under(name, "sluice.io"))
    ]
    assert not bad, bad


def test_no_import_circle_between_sink_modules() -> None:
    assert circles(imports(SINKS, SINKS / "sluice")) == []


def test_a_back_edge_makes_a_circle() -> None:
    graph = imports(SINKS, SINKS / "sluice")
    graph["sluice.sinks.files.options"] |= {"sluice.sinks.files.sink.FileSink"}  # options -> sink -> options
    assert any({"sluice.sinks.files.options", "sluice.sinks.files.sink"} <= set(c) for c in circles(graph))
