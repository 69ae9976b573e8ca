"""Where the connectors stand in the import graph (issue 23 point 4): on the source SPI and the core's leaves
only, with no import circle between their modules (the Kafka source's helpers get its options, never the
source; its formats are a subpackage that imports nothing of the source).

Every import counts: top-level, in functions, under ``TYPE_CHECKING``.
"""

from __future__ import annotations

from pathlib import Path

from tests.sinks.test_imports import _under, circles, imports

ROOT = Path(__file__).resolve().parents[2]
CONNECTORS = ROOT / "connectors"
#: what a connector may import of the core
ALLOWED = (
    "sluice.source",
    "sluice.errors",
    "sluice.durations",  # one spelling of a duration everywhere: a leaf on sluice.errors
    "sluice.config",
    "sluice.serializers",
    "sluice.events",
    "sluice.keys",
    "sluice.io",
    "sluice.connectors",
    "sluice.changes",  # the change model: a leaf the change formats share with the upsert sinks
)


def test_connectors_import_only_the_spi_and_the_leaves() -> None:
    bad = [
        f"{module} imports {name}"
        for module, names in imports(CONNECTORS, CONNECTORS / "sluice").items()
        for name in sorted(names)
        if not any(_under(name, allowed) for allowed in ALLOWED)
    ]
    assert not bad, bad


def test_no_import_circle_between_connector_modules() -> None:
    assert circles(imports(CONNECTORS, CONNECTORS / "sluice")) == []


def test_the_formats_import_nothing_of_the_source() -> None:
    kafka = "sluice.connectors.kafka"
    below = ("formats", "errors")  # what the formats may import of the Kafka package
    bad = [
        f"{module} imports {name}"
        for module, names in imports(CONNECTORS, CONNECTORS / "sluice").items()
        if _under(module, f"{kafka}.formats")
        for name in sorted(names)
        if _under(name, kafka) and not any(_under(name, f"{kafka}.{b}") for b in below)
    ]
    assert not bad, bad


def test_a_helper_importing_the_source_back_makes_a_circle() -> None:
    graph = imports(CONNECTORS, CONNECTORS / "sluice")
    graph["sluice.connectors.kafka.reader"] |= {"sluice.connectors.kafka.source.KafkaSource"}
    assert any(
        {"sluice.connectors.kafka.reader", "sluice.connectors.kafka.source"} <= set(c) for c in circles(graph)
    )
