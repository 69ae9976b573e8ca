"""Two-phase-commit sinks for sluice, and the sink SPI (re-exported from ``sluice.sink``).

* ``sluice.sinks.files`` - Parquet / JSON lines / CSV files on local disk or S3, with compaction;
* ``sluice.sinks.testing`` - a small two-phase-commit sink the fault-injection suite reads back.

Third-party sinks implement :class:`Sink` and register under the ``sluice.sinks`` entry point group;
:func:`load_sink` finds them by name.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from sluice.errors import ConfigError
from sluice.sink import (
    CommitOutcome,
    Committer,
    Compactor,
    GlobalCommitter,
    GlobalCommitterContext,
    Sink,
    SinkContext,
    SinkWriter,
)

__all__ = [
    "CommitOutcome",
    "Committer",
    "Compactor",
    "GlobalCommitter",
    "GlobalCommitterContext",
    "Sink",
    "SinkContext",
    "SinkWriter",
    "load_sink",
]


def load_sink(name: str) -> Any:
    """The Sink class registered as ``name`` in the ``sluice.sinks`` entry point group."""
    eps = {ep.name: ep for ep in entry_points(group="sluice.sinks")}
    if name not in eps:
        raise ConfigError(f"sink {name!r} is not installed (available: {sorted(eps)})")
    return eps[name].load()
