"""Sources for sluice: the SPI (re-exported from ``sluice.source``) and the built-in connectors.

* ``sluice.connectors.generator`` - a deterministic generator (tests, demos, benchmarks);
* ``sluice.connectors.kafka`` - Kafka, with offsets in checkpoints.

Third-party connectors implement :class:`Source` and register under the ``sluice.connectors`` entry point
group; :func:`load_connector` finds them by name.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from sluice.errors import ConfigError
from sluice.source import (
    Boundedness,
    EnumeratorContext,
    InputStatus,
    ReaderContext,
    ReaderOutput,
    Source,
    SourceReader,
    SourceSplit,
    SplitEnumerator,
)

__all__ = [
    "Boundedness",
    "EnumeratorContext",
    "InputStatus",
    "ReaderContext",
    "ReaderOutput",
    "Source",
    "SourceReader",
    "SourceSplit",
    "SplitEnumerator",
    "load_connector",
]


def load_connector(name: str) -> Any:
    """The Source class registered as ``name`` in the ``sluice.connectors`` entry point group."""
    eps = {ep.name: ep for ep in entry_points(group="sluice.connectors")}
    if name not in eps:
        raise ConfigError(f"connector {name!r} is not installed (available: {sorted(eps)})")
    return eps[name].load()
