"""A generator paced by checkpoints, for tests that need several checkpoints carrying rows however loaded the
machine is: each reader emits its rows in chunks of ``chunk_batches`` batches, the next chunk only after a
checkpoint whose barrier passed the reader after the previous chunk completed (so every chunk lands in a
checkpoint of its own), and ends its input once ``until()`` holds (:class:`tests.sinks.tables.cdc.Stream`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sluice.connectors.generator import GeneratorSource
from sluice.source import InputStatus, ReaderContext, ReaderOutput, SourceReader

from tests.sinks.tables.cdc import _HoldingReader


def _always() -> bool:
    return True


class Paced(GeneratorSource):
    """A :class:`GeneratorSource` paced by checkpoints (module docstring)."""

    def __init__(self, *, chunk_batches: int, until: Callable[[], bool] = _always, **kw: Any) -> None:
        super().__init__(**kw)
        self.chunk_batches = chunk_batches
        self.until = until

    def create_reader(self, ctx: ReaderContext) -> SourceReader:
        return _PacedReader(super().create_reader(ctx), self.chunk_batches, self.until)


class _PacedReader(_HoldingReader):
    def __init__(self, inner: SourceReader, chunk_batches: int, until: Callable[[], bool]) -> None:
        super().__init__(inner, until)
        self.chunk_batches = chunk_batches
        self.batches = 0
        #: None: emitting; -1: a chunk is out, waiting for a barrier; else the checkpoint that must complete
        self.gate: int | None = None

    def poll_next(self, output: ReaderOutput) -> InputStatus:
        if self.gate is not None:
            return InputStatus.NOTHING_AVAILABLE
        status = super().poll_next(output)
        if status is InputStatus.MORE_AVAILABLE:
            self.batches += 1
            if self.batches % self.chunk_batches == 0:
                self.gate = -1
        return status

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        if self.gate == -1:
            self.gate = checkpoint_id
        return super().snapshot_state(checkpoint_id)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        super().notify_checkpoint_complete(checkpoint_id)
        if self.gate is not None and 0 <= self.gate <= checkpoint_id:
            self.gate = None
