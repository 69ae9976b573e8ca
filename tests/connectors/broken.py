"""Deliberately broken connectors: each breaks one contract the conformance kit checks.

Sources are the generator with one part swapped; sinks are the test sink (Arrow files moved from
``pending/`` to ``committed/``) with one part swapped. The tests assert that the kit fails each of them
with a message naming the contract it breaks.
"""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from sluice.connectors.generator import GeneratorOptions, GeneratorSource, _Enumerator, _Reader
from sluice.serializers import PickleSerializer, SimpleVersionedSerializer, SourceSplitSerializer
from sluice.sink import (
    CommitOutcome,
    Committer,
    GlobalCommitter,
    GlobalCommitterContext,
    SinkContext,
    SinkWriter,
)
from sluice.sinks.testing import TwoPhaseCommitTestSink, _Committer, _NameSerializer, _Writer
from sluice.source import EnumeratorContext, ReaderContext, SourceReader, SourceSplit, SplitEnumerator

__all__ = ["BROKEN_SINKS", "BROKEN_SOURCES"]


_NameSerializerBase = _NameSerializer


def distinct_rows(split: int, start: int, end: int) -> pa.RecordBatch:
    """Rows whose ids never collide across splits, also past a split's end."""
    seq = np.arange(start, end, dtype=np.int64)
    return pa.RecordBatch.from_arrays([pa.array(split * 1_000_000 + seq), pa.array(seq)], names=["id", "seq"])


class _Generator(GeneratorSource):
    enumerator: type[_Enumerator] = _Enumerator
    reader: type[_Reader] = _Reader

    def __init__(self) -> None:
        super().__init__(num_splits=5, records_per_split=120, batch_size=25, rows=distinct_rows)

    def create_enumerator(self, ctx: EnumeratorContext, restored: Any | None) -> SplitEnumerator:
        return self.enumerator(self.options, ctx, restored)

    def create_reader(self, ctx: ReaderContext) -> SourceReader:
        return self.reader(self.options, ctx)

    def enumerator_state_serializer(self) -> SimpleVersionedSerializer[Any]:
        return PickleSerializer()  # some broken enumerators snapshot a state of their own shape

    def split_serializer(self) -> SimpleVersionedSerializer[SourceSplit]:
        return self.splits()

    splits: type[SimpleVersionedSerializer[SourceSplit]] = SourceSplitSerializer


# -- broken enumerators ---------------------------------------------------------------------------------
class _Forgetful(_Enumerator):
    """Forgets every split above the first half when it starts (the 5,000 of 9,000 lines of issue 14)."""

    def __init__(self, src: GeneratorOptions, ctx: EnumeratorContext, restored: Any) -> None:
        super().__init__(src, ctx, restored)
        if restored is None:
            self.unassigned = {k: v for k, v in self.unassigned.items() if int(k) < src.num_splits // 2 + 1}


class _SnapshotsNothingPending(_Enumerator):
    """Its snapshot leaves out the splits it has not assigned yet."""

    def snapshot_state(self, checkpoint_id: int) -> list[SourceSplit]:
        return []


class _IgnoresSplitsBack(_Enumerator):
    """Drops splits handed back while it runs (keeps them only when restored)."""

    def add_splits_back(self, splits: list[SourceSplit]) -> None:
        if self.ctx.registered_readers():
            return
        super().add_splits_back(splits)


class _NeverSignalsAgain(_Enumerator):
    """Tells each subtask 'no more splits' once, never again to a reader that registered again."""

    def add_reader(self, subtask: int) -> None:
        self._assign()


class _FixedParallelism(_Enumerator):
    """Assigns by the parallelism it was first started with, which it keeps in its snapshot."""

    def __init__(self, src: GeneratorOptions, ctx: EnumeratorContext, restored: Any) -> None:
        super().__init__(src, ctx, restored["splits"] if restored is not None else None)
        self.first_parallelism = restored["p"] if restored is not None else ctx.parallelism

    def _assign(self) -> None:
        registered = set(self.ctx.registered_readers())
        out: dict[int, list[SourceSplit]] = {}
        for sid in sorted(self.unassigned, key=int):
            if int(sid) % self.first_parallelism in registered:
                out.setdefault(int(sid) % self.first_parallelism, []).append(self.unassigned.pop(sid))
        self.ctx.assign_splits(out)
        if self.unassigned:
            return
        for r in sorted(registered):
            if r not in self.signalled:
                self.signalled.add(r)
                self.ctx.signal_no_more_splits(r)

    def snapshot_state(self, checkpoint_id: int) -> Any:
        return {"splits": super().snapshot_state(checkpoint_id), "p": self.first_parallelism}


# -- broken readers -------------------------------------------------------------------------------------
class _OffByOne(_Reader):
    """Snapshots the position of the last record emitted instead of the next one to read."""

    def snapshot_state(self, checkpoint_id: int) -> list[SourceSplit]:
        return [SourceSplit(s.split_id, max(0, s.position - 1), s.end) for s in self.splits.values()]


class _ReadsPastStop(_Reader):
    """Reads one batch beyond each split's end."""

    def add_splits(self, splits: list[SourceSplit]) -> None:
        super().add_splits(
            [SourceSplit(s.split_id, s.position, None if s.end is None else s.end + 10) for s in splits]
        )


class _EndsEarly(_Reader):
    """Returns END_OF_INPUT as soon as its splits are done, without waiting for 'no more splits'."""

    def notify_no_more_splits(self) -> None:
        pass

    def poll_next(self, output: Any) -> Any:
        self.no_more = True
        return super().poll_next(output)


class _NeverEnds(_Reader):
    """Ignores 'no more splits': a bounded job would never finish."""

    def notify_no_more_splits(self) -> None:
        pass


# -- broken serializers ---------------------------------------------------------------------------------
class _ForgetsPositions(SourceSplitSerializer):
    """Writes a split without its position: a restore would read it again from the start."""

    def to_json(self, obj: Any) -> Any:
        return {**super().to_json(obj), "position": 0}


class _ReadsBackAnother(_NameSerializerBase):
    """Reads back a committable other than the one it wrote."""

    def from_json(self, version: int, value: Any) -> str:
        return f"{value}.lost"


def _source(
    enumerator: type[_Enumerator] = _Enumerator,
    reader: type[_Reader] = _Reader,
    splits: type[SimpleVersionedSerializer[SourceSplit]] = SourceSplitSerializer,
) -> _Generator:
    cls = type("Broken", (_Generator,), {"enumerator": enumerator, "reader": reader, "splits": splits})
    return cls()  # type: ignore[no-any-return]


#: name -> (the broken source, the kit check that must fail, the contract its message names)
BROKEN_SOURCES: dict[str, tuple[Any, str, str]] = {
    "enumerator forgets splits": (
        lambda: _source(enumerator=_Forgetful),
        "every_split_read_once",
        "every split read exactly once",
    ),
    "reader snapshots an off-by-one position": (
        lambda: _source(reader=_OffByOne),
        "reader_restore",
        "reader restore at checkpointed positions",
    ),
    "reader reads past its stopping position": (
        lambda: _source(reader=_ReadsPastStop),
        "no_record_after_stop",
        "no record after the stopping position",
    ),
    "reader never ends": (lambda: _source(reader=_NeverEnds), "bounded_end_of_input", "bounded end of input"),
    "reader ends before 'no more splits'": (
        lambda: _source(reader=_EndsEarly),
        "bounded_end_of_input",
        "bounded end of input",
    ),
    "enumerator snapshot forgets pending splits": (
        lambda: _source(enumerator=_SnapshotsNothingPending),
        "enumerator_restore",
        "enumerator restore",
    ),
    "enumerator keeps its first parallelism": (
        lambda: _source(enumerator=_FixedParallelism),
        "rescale",
        "rescale up and down",
    ),
    "enumerator drops splits handed back": (
        lambda: _source(enumerator=_IgnoresSplitsBack),
        "failed_reader_reassignment",
        "split re-assignment after a failed reader",
    ),
    "enumerator never signals a new reader": (
        lambda: _source(enumerator=_NeverSignalsAgain),
        "failed_reader_reassignment",
        "split re-assignment after a failed reader",
    ),
    "split serializer forgets positions": (
        lambda: _source(splits=_ForgetsPositions),
        "serializers_round_trip",
        "splits and enumerator state round-trip through the source's serializers",
    ),
}


# -- broken sinks ---------------------------------------------------------------------------------------
class _VisibleWriter(_Writer):
    """Writes straight into committed/ at prepare_commit: readers see data before its checkpoint completes."""

    def prepare_commit(self, checkpoint_id: int) -> list[str]:
        names = super().prepare_commit(checkpoint_id)
        for n in names:
            shutil.copy(
                os.path.join(self.sink.directory, "pending", n),
                os.path.join(self.sink.directory, "committed", n),
            )
        return names


_copies = itertools.count()


class _CopyingCommitter(_Committer):
    """Copies each pending file under a new name every time it commits: not idempotent."""

    def commit(self, *args: Any) -> CommitOutcome:
        for name in args[-1]:
            src = os.path.join(self.sink.directory, "pending", name)
            shutil.copy(src, os.path.join(self.sink.directory, "committed", f"{name}.{next(_copies):06d}"))
        return CommitOutcome.COMMITTED


class _SilentCommitter(_Committer):
    """Commits correctly but reports nothing (returns None)."""

    def commit(self, *args: Any) -> Any:
        super().commit(*args)
        return None


class _RecommittingGlobal(_Committer):
    """A global committer that does not check whether the checkpoint is in the table: commits it again."""

    commits = 0

    def commit(self, *args: Any) -> CommitOutcome:
        _checkpoint_id, names = args
        for name in names:
            src = os.path.join(self.sink.directory, "pending", name)
            shutil.copy(src, os.path.join(self.sink.directory, "committed", f"{name}.c{next(_copies):06d}"))
        type(self).commits += 1
        return CommitOutcome.COMMITTED


class BrokenTestSink(TwoPhaseCommitTestSink):
    """The test sink with one part swapped (see the subclasses' names in BROKEN_SINKS)."""

    writer: type[_Writer] = _Writer
    committer: type[_Committer] = _Committer
    aborts: bool = True
    recovers_commits: bool = True
    serializer: type[SimpleVersionedSerializer[str]] = _NameSerializerBase

    def committable_serializer(self) -> SimpleVersionedSerializer[str]:
        return self.serializer()

    def create_writer(self, ctx: SinkContext, restored: list[Any]) -> SinkWriter[str]:
        return self.writer(self, ctx)

    def create_committer(self, ctx: SinkContext) -> Committer[str] | None:
        return None if self.global_commit else self.committer(self, ctx)

    def create_global_committer(self, ctx: GlobalCommitterContext) -> GlobalCommitter[str] | None:
        return self.committer(self, ctx)

    def recover(self, job_id: str, committables: Sequence[str]) -> None:
        if self.aborts:
            super().recover(job_id, committables)
        if not self.recovers_commits:  # deletes the restored checkpoint's pending files too
            pending = os.path.join(self.directory, "pending")
            for name in os.listdir(pending):
                os.remove(os.path.join(pending, name))


def _sink(directory: str, global_commit: bool = False, **parts: Any) -> BrokenTestSink:
    cls = type("Broken", (BrokenTestSink,), parts)
    return cls(directory, global_commit=global_commit)  # type: ignore[no-any-return]


#: name -> (directory -> the broken sink, the kit check that must fail, the contract its message names)
BROKEN_SINKS: dict[str, tuple[Any, str, str]] = {
    "data visible before commit": (
        lambda d: _sink(d, writer=_VisibleWriter),
        "nothing_visible_before_commit",
        "nothing visible before commit",
    ),
    "committer not idempotent": (
        lambda d: _sink(d, committer=_CopyingCommitter),
        "commit_idempotent",
        "commit idempotent when repeated",
    ),
    "committer reports no outcome": (
        lambda d: _sink(d, committer=_SilentCommitter),
        "commit_idempotent",
        "commit reports a CommitOutcome",
    ),
    "recover does not abort uncommitted data": (
        lambda d: _sink(d, aborts=False),
        "abort_uncommitted",
        "abort of uncommitted data",
    ),
    "recover deletes the restored checkpoint's data": (
        lambda d: _sink(d, recovers_commits=False),
        "recover_after_crash_at_commit",
        "recover after a crash",
    ),
    "global committer commits a checkpoint twice": (
        lambda d: _sink(d, global_commit=True, committer=_RecommittingGlobal),
        "one_global_commit_per_checkpoint",
        "one global commit per checkpoint",
    ),
    "committable serializer reads back something else": (
        lambda d: _sink(d, serializer=_ReadsBackAnother),
        "serializers_round_trip",
        "committables and writer state round-trip through the sink's serializers",
    ),
}
