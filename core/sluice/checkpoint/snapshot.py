"""One operator's state at a checkpoint, as its synchronous part took it (before serialization)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sluice.state.spi import StateSnapshot

__all__ = ["OperatorSnapshot"]


@dataclass
class OperatorSnapshot:
    """One operator's state at a checkpoint, before serialization."""

    #: keyed state: the synchronous part of the keyed backend's snapshot; its ``run()`` (the asynchronous
    #: part) gives the handle the task state file stores under the operator
    keyed: StateSnapshot | None = None
    operator: Any = None
    timers: list[tuple[int, int, int, Any]] | None = None
    #: committables handed to the global committer (sinks)
    committables: list[Any] | None = None
    #: work for the asynchronous part, run in the upload thread before serialization (e.g. compaction);
    #: it may replace ``operator`` and ``committables``
    async_part: Callable[[OperatorSnapshot], None] | None = None
