"""What the source harness keeps of a run: each reader's output and mailbox, and what a checkpoint holds."""

from __future__ import annotations

import collections
import copy
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from sluice.source import SourceReader, SourceSplit

__all__ = ["ReaderOutput", "ReaderRecord", "SourceCheckpoint"]


@dataclass
class SourceCheckpoint:
    """What a checkpoint holds of a source: the enumerator's snapshot and every reader's splits.

    Attributes:
        checkpoint_id: the checkpoint's id.
        enumerator: the enumerator's snapshot (after a round trip through its serializer).
        splits: per subtask, the splits its reader snapshotted (with positions).
        emitted: per subtask, how many batches its reader had emitted at the checkpoint.
        since: per subtask, splits assigned to it after this checkpoint (filled in as the run goes on).
        no_more: subtasks whose reader had been told "no more splits" at the checkpoint.
    """

    checkpoint_id: int
    enumerator: Any
    splits: dict[int, list[SourceSplit]]
    emitted: dict[int, int]
    since: dict[int, list[SourceSplit]] = field(default_factory=dict)
    no_more: set[int] = field(default_factory=set)

    def all_splits(self) -> list[SourceSplit]:
        """Every reader's splits, in subtask order (what the engine hands back to the enumerator)."""
        return [copy.deepcopy(s) for i in sorted(self.splits) for s in self.splits[i]]


class ReaderOutput:
    """The ReaderOutput of one reader: keeps what it emitted."""

    def __init__(self) -> None:
        self.batches: list[pa.RecordBatch] = []
        self.side: dict[str, list[pa.RecordBatch]] = collections.defaultdict(list)
        self.watermarks: list[int] = []

    def emit(self, batch: pa.RecordBatch) -> None:
        self.batches.append(batch)

    def emit_side(self, tag: str, batch: pa.RecordBatch) -> None:
        self.side[tag].append(batch)

    def emit_watermark(self, timestamp_ms: int) -> None:
        self.watermarks.append(timestamp_ms)

    def mark_idle(self) -> None:
        pass


@dataclass
class ReaderRecord:
    subtask: int
    reader: SourceReader
    output: ReaderOutput
    inbox: collections.deque[tuple[str, list[SourceSplit]]] = field(default_factory=collections.deque)
    owned: set[str] = field(default_factory=set)
    #: the enumerator signalled 'no more splits' (it may still wait in the inbox)
    signalled: bool = False
    no_more: bool = False
    ended: bool = False
    #: returned NOTHING_AVAILABLE since its last assignment (see SourceRun._deliver)
    idle: bool = False
