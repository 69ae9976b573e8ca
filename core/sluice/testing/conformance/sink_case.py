"""A sink under test (:class:`SinkCase`) and the kit's default data (:func:`sample_batch`)."""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from sluice.errors import ConfigError
from sluice.testing.conformance.contracts import row_counts
from sluice.testing.conformance.sink_harness import SinkTarget

__all__ = ["SinkCase", "sample_batch"]

_SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.string()), ("value", pa.float64())])


def sample_batch(round_: int, subtask: int, seq: int, rows: int = 25) -> pa.RecordBatch:
    """The kit's default data: ``rows`` rows with a unique ``id``, a ``key`` and a ``value``."""
    start = ((round_ * 64 + subtask) * 16 + seq) * rows
    ids = np.arange(start, start + rows, dtype=np.int64)
    return pa.RecordBatch.from_arrays(
        [pa.array(ids), pa.array([f"k{i % 3}" for i in ids.tolist()]), pa.array(ids * 0.5)], schema=_SCHEMA
    )


@dataclass
class SinkCase:
    """A sink under test.

    Args:
        new_target: makes a fresh target (a sink writing to its own empty place) for each check.
        batch: ``(round, subtask, seq) -> RecordBatch``: the data subtask ``subtask`` writes in ``round``
            (default :func:`sample_batch`); records must be distinct.
        columns: the columns a reader gets back that identify a record (default: all it gets back).
        parallelism: writer subtasks.
        rounds: rounds of data, one checkpoint each (at least 3).
        batches_per_round: batches each subtask writes per round.
    """

    new_target: Callable[[], SinkTarget]
    batch: Callable[[int, int, int], pa.RecordBatch] = sample_batch
    columns: Sequence[str] | None = None
    parallelism: int = 2
    rounds: int = 4
    batches_per_round: int = 2

    def __post_init__(self) -> None:
        if not callable(self.new_target):
            raise ConfigError("SinkCase: new_target must be a function returning a SinkTarget")
        if not isinstance(self.rounds, int) or self.rounds < 3:
            raise ConfigError(f"SinkCase: rounds must be an integer >= 3 (got {self.rounds!r})")
        if not isinstance(self.parallelism, int) or self.parallelism < 1:
            raise ConfigError(f"SinkCase: parallelism must be an integer >= 1 (got {self.parallelism!r})")

    def data(self, round_: int) -> dict[int, list[pa.RecordBatch]]:
        """What every subtask writes in ``round_`` (1-based)."""
        return {
            i: [self.batch(round_, i, s) for s in range(self.batches_per_round)]
            for i in range(self.parallelism)
        }

    def expected(self, rounds: Sequence[int]) -> collections.Counter[str]:
        return row_counts([b for r in rounds for bs in self.data(r).values() for b in bs], self.columns)

    def target(self) -> SinkTarget:
        t = self.new_target()
        if not isinstance(t, SinkTarget):
            raise ConfigError(f"SinkCase: new_target() must return a SinkTarget (got {type(t).__name__})")
        return t
