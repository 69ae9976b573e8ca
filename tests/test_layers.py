"""The layers of sluice, written once, and a test that no import runs from a lower layer to a higher one.

A module may import modules of its own layer and of layers below it, never above. Every import counts:
top-level, inside functions (lazy) and under ``TYPE_CHECKING``. Layers, bottom up (docs/architecture.md
draws them):

0. leaves: the SPIs and what they are made of (errors, events, source, sink, state, keys, functions,
   config, serializers, io, changes, durations)
1. connectors and sinks, beside each other just above the SPI
2. graph
3. checkpoint
4. operators
5. runtime
6. runtime.spark (the only pyspark user)
7. client and control
8. api
9. settings, cli, testing, templates, and the package root ``sluice`` (which re-exports the API)

A module's layer is that of the longest name in :data:`LAYERS` it falls under.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

from tests.test_dependencies import ROOT, modules

#: module name (or package prefix) -> layer; the one place the layers are written
LAYERS: dict[str, int] = {
    **dict.fromkeys(
        [
            "sluice.errors", "sluice.events", "sluice.source", "sluice.sink", "sluice.state", "sluice.keys",
            "sluice.functions", "sluice.config", "sluice.serializers", "sluice.io", "sluice.changes",
            "sluice.durations",
        ],
        0,
    ),
    "sluice.connectors": 1,
    "sluice.sinks": 1,
    "sluice.graph": 2,
    "sluice.checkpoint": 3,
    "sluice.operators": 4,
    "sluice.runtime": 5,
    "sluice.runtime.spark": 6,
    "sluice.client": 7,
    "sluice.control": 7,
    "sluice.api": 8,
    **dict.fromkeys(["sluice", "sluice.settings", "sluice.cli", "sluice.testing", "sluice.templates"], 9),
}  # fmt: skip


def layer_of(name: str) -> int | None:
    """The layer of module ``name`` (None for modules outside sluice)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in LAYERS:
            return LAYERS[prefix]
    return None


def back_edges(graph: dict[str, set[str]]) -> list[str]:
    """Imports from a module to one of a higher layer, as ``a (layer) imports b (layer)``."""
    bad = []
    for name, imported in sorted(graph.items()):
        own = layer_of(name)
        assert own is not None, f"{name} has no layer: add it to LAYERS"
        for imp in sorted(imported):
            theirs = layer_of(imp)
            if theirs is not None and theirs > own:
                bad.append(f"{name} (layer {own}) imports {imp} (layer {theirs})")
    return bad


def import_graph() -> dict[str, set[str]]:
    return {name: imported for name, (_, imported) in modules().items()}


def test_every_module_has_a_layer() -> None:
    assert not [name for name in import_graph() if layer_of(name) is None]


def test_no_import_runs_from_a_lower_layer_to_a_higher_one() -> None:
    assert not back_edges(import_graph())


@pytest.mark.parametrize(
    ("importer", "imported"),
    [
        ("sluice.checkpoint.subtask", "sluice.runtime.task"),  # checkpoint/ above runtime/ again
        ("sluice.sinks.files.writer", "sluice.checkpoint.storage"),  # a sink above checkpoint/
        ("sluice.state.keygroups", "sluice.graph"),  # a leaf above the graph
        ("sluice.runtime.job", "sluice.control.server"),  # the runner above control/
    ],
)
def test_a_back_edge_is_caught(importer: str, imported: str) -> None:
    """The check itself: adding one import that runs up the layers makes it fail (naming the import)."""
    graph = import_graph()
    assert importer in graph, importer
    graph[importer] = graph[importer] | {imported}
    assert back_edges(graph) == [f"{importer} (layer {layer_of(importer)}) imports {imported} (layer {layer_of(imported)})"]


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (import circles), by Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = itertools.count()

    def visit(v: str) -> None:
        index[v] = low[v] = next(counter)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _role(name: str) -> str:
    """A module's role: its package under sluice (``sluice.checkpoint``, ``sluice.sinks.delta``, ...)."""
    parts = name.split(".")
    return ".".join(parts[:3] if parts[1] in ("connectors", "sinks") else parts[:2])


def test_no_import_circle_between_modules_of_different_roles() -> None:
    full = import_graph()
    graph = {n: {i for i in imp if i in full} for n, imp in full.items()}
    mixed = [c for c in _circles(graph) if len({_role(m) for m in c}) > 1]
    assert not mixed, mixed


def test_a_circle_between_roles_is_caught() -> None:
    """The check itself: two modules of one layer but different roles importing each other make a circle."""
    full = import_graph()
    a, b = "sluice.connectors.kafka.source", "sluice.sinks.files.sink"
    assert a in full and b in full
    graph = {n: {i for i in imp if i in full} for n, imp in full.items()}
    graph[a] = graph[a] | {b}
    graph[b] = graph[b] | {a}
    mixed = [c for c in _circles(graph) if len({_role(m) for m in c}) > 1]
    assert any(a in c and b in c for c in mixed)


def _runtime_imports(package: str) -> dict[str, set[str]]:
    """The modules of ``package`` -> the modules of ``package`` they import when they run: top-level and lazy
    (in a function) imports, not those under ``TYPE_CHECKING`` (annotations only). Importing ``a.b.c`` runs
    ``a.b``'s ``__init__`` first, so it counts as importing that package too (unless the importer lies
    inside it: then the package is already being imported)."""
    graph: dict[str, set[str]] = {}
    base = ROOT / "core"
    for path in (base / Path(*package.split("."))).rglob("*.py"):
        rel = path.relative_to(base).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        name, is_package = ".".join(parts), rel.name == "__init__"
        tree = ast.parse(path.read_text(), str(path))
        hidden = {
            id(n)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
            for stmt in node.body
            for n in ast.walk(stmt)
        }
        imported: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in hidden:
                continue
            if isinstance(node, ast.Import):
                imported.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level:  # relative: from the importer's package upwards
                    anchor = parts if is_package else parts[:-1]
                    module = ".".join([*anchor[: len(anchor) - node.level + 1], *([module] if module else [])])
                imported.add(module)
                imported.update(f"{module}.{a.name}" for a in node.names)
        graph[name] = imported
    out: dict[str, set[str]] = {}
    for name, imported in graph.items():
        edges: set[str] = set()
        for imp in imported:
            steps = imp.split(".")
            for n in range(1, len(steps) + 1):
                target = ".".join(steps[:n])
                if target in graph and target != name and not name.startswith(target + "."):
                    edges.add(target)
        out[name] = edges
    return out


#: packages whose modules import each other without a circle (the layers inside them are real)
ACYCLIC_PACKAGES = ["sluice.state"]


@pytest.mark.parametrize("package", ACYCLIC_PACKAGES)
def test_no_import_circle_inside_the_package(package: str) -> None:
    graph = _runtime_imports(package)
    assert len(graph) > 20, sorted(graph)  # the modules were found
    assert not _circles(graph)


@pytest.mark.parametrize(
    ("importer", "imported"),
    [
        ("sluice.state.config", "sluice.state.factory"),  # StateBackendConfig.create() back in config
        ("sluice.state.changelog.capture", "sluice.state.hashmap.backend"),  # capture reaching into hashmap
        ("sluice.state.changelog.restore", "sluice.state.hashmap.backend"),  # changelog restore naming hashmap
        ("sluice.state.rocksdb.states", "sluice.state.rocksdb.backend"),  # a type-only import made a real one
    ],
)
def test_a_circle_inside_sluice_state_is_caught(importer: str, imported: str) -> None:
    """The check itself: one import that runs back up the state layer makes a circle."""
    graph = _runtime_imports("sluice.state")
    assert imported not in graph[importer]
    graph[importer] = graph[importer] | {imported}
    assert any(importer in c and imported in c for c in _circles(graph))


def test_type_checking_imports_and_package_inits_are_read_as_python_runs_them() -> None:
    graph = _runtime_imports("sluice.state")
    assert "sluice.state.meta" not in graph["sluice.state.spi"]  # under TYPE_CHECKING only
    assert "sluice.state.rocksdb.backend" not in graph["sluice.state.rocksdb.states"]  # likewise
    assert "sluice.state.rocksdb.restore" in graph["sluice.state.rocksdb.backend"]  # a lazy import counts
    # importing sluice.state.changelog.restore runs sluice.state.changelog's __init__ first
    assert {"sluice.state.changelog", "sluice.state.changelog.restore"} <= graph["sluice.state.hashmap.backend"]
    assert "sluice.state.hashmap" not in graph["sluice.state.hashmap.backend"]  # its own package: already running
