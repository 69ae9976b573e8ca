"""A deterministic generator source: every split yields the same rows in every run.

Row ``seq`` of split ``s`` has ``id = s * records_per_split + seq``, ``key = id % num_keys``,
``value = id * 7 % 1000`` and ``ts`` (event time, ms) ``= start_ms + seq * step_ms``. Splits are assigned
to reader ``split % parallelism``; the position is the next ``seq`` to emit.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Annotated, Any

import numpy as np
import pyarrow as pa
from pydantic import SkipValidation
from sluice.config import _Frozen
from sluice.connectors.options import OptionAttributes, duration, must
from sluice.durations import Duration
from sluice.errors import ConfigError
from sluice.serializers import JsonSerializer, SimpleVersionedSerializer, SourceSplitSerializer
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

__all__ = ["GeneratorOptions", "GeneratorSource", "default_rows"]

SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("split", pa.int32()),
        ("seq", pa.int64()),
        ("key", pa.int64()),
        ("value", pa.int64()),
        ("ts", pa.int64()),
    ]
)


def default_rows(
    split: int, start: int, end: int, records_per_split: int, num_keys: int, step_ms: int
) -> pa.RecordBatch:
    """Rows ``start..end`` of ``split``."""
    seq = np.arange(start, end, dtype=np.int64)
    ids = split * records_per_split + seq
    return pa.RecordBatch.from_arrays(
        [
            pa.array(ids),
            pa.array(np.full(len(seq), split, np.int32)),
            pa.array(seq),
            pa.array(ids % num_keys),
            pa.array(ids * 7 % 1000),
            pa.array(1_600_000_000_000 + seq * step_ms),
        ],
        schema=SCHEMA,
    )


_must = functools.partial(must, "GeneratorSource")
_Count1 = Annotated[int, SkipValidation, _must("an integer >= 1", lambda v: isinstance(v, int) and v >= 1)]


class GeneratorOptions(_Frozen):
    """The options of a :class:`GeneratorSource`, checked when it is created."""

    num_splits: _Count1 = 4
    records_per_split: Annotated[
        int | None, SkipValidation, _must("an integer >= 0 or None", lambda v: v is None or (isinstance(v, int) and v >= 0))
    ] = 1000
    batch_size: _Count1 = 100
    num_keys: _Count1 = 100
    rows_per_second: Annotated[
        float | None,
        SkipValidation,
        _must("> 0 or None", lambda v: v is None or (isinstance(v, int | float) and v > 0)),
    ] = None
    step_ms: Annotated[int, SkipValidation, duration("GeneratorSource", bare="ms", sign="non-negative")] = 10
    out_of_orderness_ms: Annotated[
        int, SkipValidation, duration("GeneratorSource", bare="ms", sign="non-negative")
    ] = 0
    rows: Annotated[Callable[[int, int, int], pa.RecordBatch] | None, SkipValidation] = None
    name: str = "generator"

    @property
    def bounded(self) -> bool:
        """Whether every split ends (``records_per_split`` given)."""
        return self.records_per_split is not None

    def make_rows(self, split: int, start: int, end: int) -> pa.RecordBatch:
        """Rows ``start..end`` of ``split``."""
        if self.rows is not None:
            return self.rows(split, start, end)
        return default_rows(split, start, end, self.records_per_split or 2**40, self.num_keys, self.step_ms)


class GeneratorSource(OptionAttributes[GeneratorOptions], Source):
    """Deterministic rows in ``num_splits`` splits.

    Args:
        num_splits: number of splits.
        records_per_split: rows per split; None = unbounded.
        batch_size: rows per emitted batch.
        num_keys: distinct values of the ``key`` column.
        rows_per_second: per reader; None = as fast as possible.
        step_ms: event-time step between consecutive rows of a split.
        out_of_orderness_ms: watermark = min over splits of the last timestamp minus this.
        rows: custom ``fn(split, start, end) -> RecordBatch`` replacing the default columns.

    The options are checked at once into the frozen :attr:`options` (:class:`GeneratorOptions`), which the
    enumerator and readers get; each option reads as an attribute too (``gen.num_splits``).
    """

    name = "generator"
    options_model = GeneratorOptions

    def __init__(
        self,
        num_splits: int = 4,
        records_per_split: int | None = 1000,
        batch_size: int = 100,
        num_keys: int = 100,
        rows_per_second: float | None = None,
        step_ms: Duration = 10,
        out_of_orderness_ms: Duration = 0,
        rows: Callable[[int, int, int], pa.RecordBatch] | None = None,
        name: str = "generator",
    ) -> None:
        self._take(locals())
        self.validate()
        self.name = name

    @property
    def boundedness(self) -> Boundedness:
        return Boundedness.BOUNDED if self.options.bounded else Boundedness.CONTINUOUS

    @property
    def output_schema(self) -> pa.Schema | None:
        return SCHEMA if self.options.rows is None else None

    def make_rows(self, split: int, start: int, end: int) -> pa.RecordBatch:
        """Rows ``start..end`` of ``split``."""
        return self.options.make_rows(split, start, end)

    def create_enumerator(self, ctx: EnumeratorContext, restored: Any | None) -> SplitEnumerator:
        return _Enumerator(self.options, ctx, restored)

    def create_reader(self, ctx: ReaderContext) -> SourceReader:
        return _Reader(self.options, ctx)

    def split_serializer(self) -> SimpleVersionedSerializer[SourceSplit]:
        """Splits go into checkpoints as JSON."""
        return SourceSplitSerializer()

    def enumerator_state_serializer(self) -> SimpleVersionedSerializer[Any]:
        """The unassigned splits go into checkpoints as JSON."""
        return _SplitListSerializer()

    def expected(self) -> pa.Table:
        """Every row a bounded generator emits (for tests)."""
        n = self.options.records_per_split
        if n is None:
            raise ConfigError("expected() needs a bounded generator")
        return pa.Table.from_batches([self.make_rows(s, 0, n) for s in range(self.options.num_splits)])


class _SplitListSerializer(JsonSerializer[list[SourceSplit]]):
    _split = SourceSplitSerializer()

    def to_json(self, obj: list[SourceSplit]) -> Any:
        return [self._split.to_json(s) for s in obj]

    def from_json(self, version: int, value: Any) -> list[SourceSplit]:
        return [self._split.from_json(version, s) for s in value]


class _Enumerator(SplitEnumerator):
    def __init__(
        self, src: GeneratorOptions, ctx: EnumeratorContext, restored: list[SourceSplit] | None
    ) -> None:
        self.src = src
        self.ctx = ctx
        if restored is None:
            self.unassigned = {
                str(i): SourceSplit(str(i), 0, src.records_per_split) for i in range(src.num_splits)
            }
        else:
            self.unassigned = {s.split_id: s for s in restored}
        self.signalled: set[int] = set()

    def add_reader(self, subtask: int) -> None:
        self.signalled.discard(subtask)  # a reader registered again (after a failure) starts with nothing
        self._assign()

    def add_splits_back(self, splits: list[SourceSplit]) -> None:
        for s in splits:
            self.unassigned[s.split_id] = s
        self._assign()

    def _assign(self) -> None:
        p = self.ctx.parallelism
        registered = set(self.ctx.registered_readers())  # a failed reader is not, until it registers again
        out: dict[int, list[SourceSplit]] = {}
        for sid in sorted(self.unassigned, key=int):
            owner = int(sid) % p
            if owner in registered:
                out.setdefault(owner, []).append(self.unassigned.pop(sid))
        self.ctx.assign_splits(out)
        if not self.unassigned and self.src.bounded:
            for r in sorted(registered):
                if r not in self.signalled:
                    self.signalled.add(r)
                    self.ctx.signal_no_more_splits(r)

    def snapshot_state(self, checkpoint_id: int) -> list[SourceSplit]:
        return [SourceSplit(s.split_id, s.position, s.end) for s in self.unassigned.values()]


class _Reader(SourceReader):
    def __init__(self, src: GeneratorOptions, ctx: ReaderContext) -> None:
        self.src = src
        self.ctx = ctx
        self.splits: dict[str, SourceSplit] = {}
        self.no_more = False
        self._rr = 0
        self._started = time.monotonic()
        self._emitted = 0

    def add_splits(self, splits: list[SourceSplit]) -> None:
        for s in splits:
            self.splits[s.split_id] = SourceSplit(s.split_id, s.position, s.end)

    def notify_no_more_splits(self) -> None:
        self.no_more = True

    def poll_next(self, output: ReaderOutput) -> InputStatus:
        live = [s for s in self.splits.values() if s.end is None or s.position < s.end]
        if not live:
            return InputStatus.END_OF_INPUT if self.no_more else InputStatus.NOTHING_AVAILABLE
        if self.src.rows_per_second is not None:
            allowed = (time.monotonic() - self._started) * self.src.rows_per_second
            if self._emitted >= allowed:
                return InputStatus.NOTHING_AVAILABLE
        s = live[self._rr % len(live)]
        self._rr += 1
        start = s.position
        end = start + self.src.batch_size if s.end is None else min(s.end, start + self.src.batch_size)
        batch = self.src.make_rows(int(s.split_id), start, end)
        s.position = end
        self._emitted += end - start
        output.emit(batch)
        wm = (
            min(
                1_600_000_000_000 + (x.position - 1) * self.src.step_ms
                for x in self.splits.values()
                if x.position > 0
            )
            if all(x.position > 0 for x in self.splits.values())
            else None
        )
        if wm is not None:
            output.emit_watermark(wm - self.src.out_of_orderness_ms)
        return InputStatus.MORE_AVAILABLE

    def snapshot_state(self, checkpoint_id: int) -> list[SourceSplit]:
        return [SourceSplit(s.split_id, s.position, s.end) for s in self.splits.values()]
