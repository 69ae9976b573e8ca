"""Deterministic pipeline shapes for the fault-injection suite, and the scenario runner.

Each shape's committed output is a set of rows that does not depend on thread interleavings: keys are
derived from (split, seq) so all rows of a key come from one split, in order, through FIFO channels; the
keyed operator emits, per row, the running count and sum of its key. The reference every scenario is
judged by is computed from the generators' input in plain Python (tests/faults/expected.py), never by a run.
"""

from __future__ import annotations

import random
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from sluice import (
    CheckpointConfig,
    FixedDelayRestart,
    JobFailedError,
    JobResult,
    KeyedProcessFunction,
    NoRestart,
    Pipeline,
    ValueStateDescriptor,
)
from sluice.connectors.generator import GeneratorSource
from sluice.runtime.fault_hook import FaultHook
from sluice.sink import Sink
from sluice.sinks.testing import TwoPhaseCommitTestSink, read_committed
from sluice.source import InputStatus, ReaderContext, ReaderOutput, SourceReader, SourceSplit

from tests.faults.backends import BACKENDS as ALL_BACKENDS
from tests.faults.backends import backend_config

#: one entry per fault scenario, summed up at the end of the run (tests/conftest.py)
SCENARIO_LOG: list[dict[str, Any]] = []

#: sinks a shape can write to besides the test sink and the tables, by ``sink`` name: (make the sink that
#: writes the output of folder ``out``, read back the rows it committed there); tests/faults/external.py
#: registers the Kafka and PostgreSQL sinks
EXTERNAL_SINKS: dict[str, tuple[Callable[[str], Sink[Any]], Callable[[str], list[tuple[Any, ...]]]]] = {}


def record(
    family: str,
    scenario: Any,
    shape: str,
    mode: str,
    fired: bool,
    crashes: int,
    got: Any,
    expected: Any,
    tier: str = "crashes",
    backend: str = "hashmap",
) -> None:
    """Log a scenario for the summary line: whether its faults fired, its crashes, rows lost and duplicated;
    ``tier`` "beyond" for the faults that are not crashes (tests/faults/beyond.py), counted by family;
    ``backend`` the state backend (scenarios of the keyed shapes are counted per backend)."""
    g, e = Counter(got), Counter(expected)
    SCENARIO_LOG.append(
        {
            "tier": tier,
            "backend": backend,
            "family": family,
            "scenario": scenario,
            "shape": shape,
            "mode": mode,
            "fired": fired,
            "crashes": crashes,
            "lost": sum((e - g).values()),
            "duplicated": sum((g - e).values()),
        }
    )


def with_key(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Add ``k``: a key whose rows all come from one split."""
    k = pc.add(
        pc.multiply(pc.cast(batch.column("split"), pa.int64()), 100), pc.bit_wise_and(batch.column("seq"), 7)
    )
    return batch.append_column("k", k)


class RunningCount(KeyedProcessFunction):
    """Per row: the running count and sum of ``value`` of its key (deterministic per key order)."""

    def open(self, ctx: Any) -> None:
        self.count = ValueStateDescriptor("count", 0)
        self.total = ValueStateDescriptor("total", 0)

    def process(self, key: Any, rows: pa.RecordBatch, ctx: Any) -> pa.RecordBatch:
        c, t = ctx.state(self.count), ctx.state(self.total)
        values = rows.column("value")
        counts = pc.add(pa.array(range(1, rows.num_rows + 1), pa.int64()), c.value())
        sums = pc.add(pc.cumulative_sum(values), t.value())
        c.update(c.value() + rows.num_rows)
        t.update(sums[-1].as_py())
        return pa.RecordBatch.from_arrays(
            [rows.column("id"), rows.column("k"), counts, sums], names=["id", "k", "count", "sum"]
        )


@dataclass
class Shape:
    name: str
    build: Callable[[Pipeline, Build], None]


#: completed checkpoints a source reader waits for, in every attempt, before it ends its input: the
#: checkpoint-driven fault points (alignment, channel state, snapshots, completions) are reached at least
#: this often however fast or slow the machine runs the job (tests/faults/plans.py arms them within it)
LINGER_CHECKPOINTS = 3


def _gen(b: Build, name: str = "generator", offset: int = 0) -> GeneratorSource:
    rng = b.rng
    splits = rng.randint(1, 5)
    per_split = rng.choice([200, 400, 700])
    b.inputs.append(Input(name, splits, per_split, offset))

    def rows(split: int, start: int, end: int) -> pa.RecordBatch:
        from sluice.connectors.generator import default_rows

        b = default_rows(split, start, end, per_split, 50, 10)
        return b.set_column(0, "id", pc.add(b.column("id"), offset))

    return _Lingering(
        num_splits=splits,
        records_per_split=per_split,
        batch_size=rng.choice([10, 25, 60]),
        rows=rows,
        name=name,
        rows_per_second=b.rate,
    )


class _Lingering(GeneratorSource):
    """A generator whose readers end their input only after ``LINGER_CHECKPOINTS`` completed checkpoints."""

    def create_reader(self, ctx: ReaderContext) -> SourceReader:
        return _LingeringReader(super().create_reader(ctx))


class _LingeringReader(SourceReader):
    def __init__(self, inner: SourceReader) -> None:
        self.inner = inner
        self.completed = 0

    def start(self) -> None:
        self.inner.start()

    def add_splits(self, splits: list[SourceSplit]) -> None:
        self.inner.add_splits(splits)

    def notify_no_more_splits(self) -> None:
        self.inner.notify_no_more_splits()

    def poll_next(self, output: ReaderOutput) -> InputStatus:
        status = self.inner.poll_next(output)
        if status is InputStatus.END_OF_INPUT and self.completed < LINGER_CHECKPOINTS:
            return InputStatus.NOTHING_AVAILABLE
        return status

    def snapshot_state(self, checkpoint_id: int) -> list[SourceSplit]:
        return self.inner.snapshot_state(checkpoint_id)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.completed += 1
        self.inner.notify_checkpoint_complete(checkpoint_id)

    def close(self) -> None:
        self.inner.close()


@dataclass(frozen=True)
class Input:
    """What one of a shape's generators reads: ``splits`` x ``per_split`` rows of
    :func:`sluice.connectors.generator.default_rows` (50 keys, 10 ms apart), ``offset`` added to ``id``."""

    name: str
    splits: int
    per_split: int
    offset: int


class Build:
    """What a shape's builder draws from: the scenario's random stream, and an optional parallelism override.

    ``par`` always consumes one draw, so a rescaled run generates the same data as the original one.
    """

    def __init__(
        self,
        rng: random.Random,
        out: str,
        scale: int | None = None,
        global_commit: bool = False,
        rate: float | None = None,
        sink: str = "test",
    ) -> None:
        self.rng = rng
        self.out = out
        self.scale = scale
        self.global_commit = global_commit
        self.rate = rate  # rows per second per source reader (None: as fast as possible)
        self.sink_kind = sink  # "test" (TwoPhaseCommitTestSink), "delta" or "iceberg"
        self.inputs: list[Input] = []  # the generators' inputs, in the order the shape built them

    def par(self) -> int:
        drawn = self.rng.randint(1, 4)
        return self.scale or drawn

    def sink(self) -> Sink[Any]:
        if self.sink_kind in EXTERNAL_SINKS:
            return EXTERNAL_SINKS[self.sink_kind][0](self.out)
        if self.sink_kind != "test":
            return table_target(self.sink_kind, self.out).sink()
        return TwoPhaseCommitTestSink(self.out, global_commit=self.global_commit)


def table_target(kind: str, out: str) -> Any:
    """The Delta or Iceberg table a shape's sink writes under ``out`` (tests/sinks/tables/helpers.py)."""
    from tests.sinks.tables.helpers import Target

    return Target(kind, out, {}, out)


def committed_rows(sink: str, out: str) -> list[tuple[Any, ...]]:
    """What a reader sees: the test sink's committed files, or the table's current version."""
    if sink == "test":
        return rows_of(read_committed(out))
    if sink in EXTERNAL_SINKS:
        return EXTERNAL_SINKS[sink][1](out)
    return rows_of(table_target(sink, out).read())


def chain(p: Pipeline, b: Build) -> None:
    s = p.source(_gen(b))
    s = s.map_batches(lambda x: x.append_column("double", pc.multiply(x.column("value"), 2)))
    s.filter(pc.field("value") >= 0).sink(b.sink())


def keyed(p: Pipeline, b: Build) -> None:
    s = p.source(_gen(b), parallelism=b.par()).map_batches(with_key)
    s.key_by("k").process(RunningCount(), parallelism=b.par()).sink(b.sink(), parallelism=b.par())


def union(p: Pipeline, b: Build) -> None:
    # forward edges into the union keep each split's rows on one FIFO path, so per-key order is fixed
    par = b.par()
    x = p.source(_gen(b, "gen-a"), parallelism=par).map_batches(with_key, name="key-a", parallelism=par)
    y = p.source(_gen(b, "gen-b", offset=10**9), parallelism=par)
    y = y.map_batches(
        lambda z: with_key(z).set_column(6, "k", pc.add(with_key(z).column("k"), 10**6)),
        name="key-b",
        parallelism=par,
    )
    u = x.union(y, parallelism=par)
    u.key_by("k").process(RunningCount(), parallelism=b.par()).sink(b.sink())


def rebalanced(p: Pipeline, b: Build) -> None:
    s = p.source(_gen(b), parallelism=b.par()).rebalance(parallelism=b.par())
    s.map_batches(lambda x: x.select(["id", "value"])).sink(b.sink(), parallelism=b.par())


def two_keyed(p: Pipeline, b: Build) -> None:
    s = p.source(_gen(b), parallelism=b.par()).map_batches(with_key)
    s = s.key_by("k").process(RunningCount(), parallelism=b.par())
    s = s.map_batches(lambda x: x.append_column("value", x.column("count")), name="again")
    s.key_by("k").process(RunningCount(), name="second", parallelism=b.par()).sink(b.sink())


#: the base state backends other suites run their jobs on (hashmap, RocksDB incremental); every variant the
#: fault shapes run on (with changelog, with local recovery) is in tests/faults/backends.py
BACKENDS = {name: ALL_BACKENDS[name] for name in ("hashmap", "rocksdb")}
#: the shapes with keyed state (the others run the same on every backend)
KEYED_SHAPES = ("keyed", "union", "two_keyed")

SHAPES = [
    Shape("chain", chain),
    Shape("keyed", keyed),
    Shape("union", union),
    Shape("rebalance", rebalanced),
    Shape("two_keyed", two_keyed),
]
SHAPE = {s.name: s for s in SHAPES}


@dataclass
class Run:
    """What a scenario run left: the committed rows and the job's result (None if the job failed)."""

    rows: list[tuple[Any, ...]]
    result: JobResult | None
    checkpoints: str
    error: BaseException | None = None


def run_shape(
    shape: Shape,
    seed: int,
    faults: FaultHook | None,
    mode: str = "exactly_once",
    alignment: dict[str, Any] | None = None,
    attempts: int = 6,
    *,
    runtime: str = "local",
    checkpoint: dict[str, Any] | None = None,
    global_commit: bool | None = None,
    scale: int | None = None,
    directory: str | None = None,
    restore: str = "none",
    sink: str = "test",
    backend: str = "hashmap",
) -> Run:
    """Build ``shape`` with ``seed`` and run it to the end; return the committed output.

    ``directory`` reuses an earlier run's sink and checkpoints (``restore="latest"`` resumes it), ``scale``
    overrides every drawn parallelism, ``global_commit`` (default: drawn) picks the test sink's commit path,
    ``sink`` the sink: the test sink, or a Delta or Iceberg table (one global commit per checkpoint);
    ``backend`` the state backend (by name: ``tests/faults/backends.py``).
    """
    args = (shape, seed, faults, mode, alignment, attempts, runtime, checkpoint, global_commit, scale)
    if directory is None:
        with tempfile.TemporaryDirectory(prefix=f"sluice-{shape.name}-{seed}-") as d:
            return _run(*args, d, restore, sink, backend)
    return _run(*args, directory, restore, sink, backend)


def _run(
    shape: Shape,
    seed: int,
    faults: FaultHook | None,
    mode: str,
    alignment: dict[str, Any] | None,
    attempts: int,
    runtime: str,
    checkpoint: dict[str, Any] | None,
    global_commit: bool | None,
    scale: int | None,
    d: str,
    restore: str,
    sink: str = "test",
    backend: str = "hashmap",
) -> Run:
    p = pipeline_of(
        shape, seed, d, mode, alignment, attempts, checkpoint, global_commit, scale, sink=sink, backend=backend
    )
    result: JobResult | None = None
    error: BaseException | None = None
    try:
        result = p.run(runtime=runtime, faults=faults, restore=restore)
    except JobFailedError as exc:
        error = exc
    return Run(committed_rows(sink, f"{d}/out"), result, f"{d}/chk", error)


def pipeline_of(
    shape: Shape,
    seed: int,
    d: str,
    mode: str = "exactly_once",
    alignment: dict[str, Any] | None = None,
    attempts: int = 6,
    checkpoint: dict[str, Any] | None = None,
    global_commit: bool | None = None,
    scale: int | None = None,
    rate: float | None = None,
    sink: str = "test",
    backend: str = "hashmap",
) -> Pipeline:
    """The pipeline of ``shape`` with ``seed``, its sink and checkpoints in ``d`` (see :func:`run_shape`)."""
    return _assemble(shape, seed, d, mode, alignment, attempts, checkpoint, global_commit, scale, rate, sink, backend)[0]


def inputs_of(shape: Shape, seed: int) -> list[Input]:
    """The generators' inputs of ``shape`` with ``seed`` (what :func:`pipeline_of` builds; nothing runs)."""
    with tempfile.TemporaryDirectory(prefix="sluice-inputs-") as d:
        return _assemble(shape, seed, d)[1].inputs


def _assemble(
    shape: Shape,
    seed: int,
    d: str,
    mode: str = "exactly_once",
    alignment: dict[str, Any] | None = None,
    attempts: int = 6,
    checkpoint: dict[str, Any] | None = None,
    global_commit: bool | None = None,
    scale: int | None = None,
    rate: float | None = None,
    sink: str = "test",
    backend: str = "hashmap",
) -> tuple[Pipeline, Build]:
    rng = random.Random(seed)
    drawn = rng.random() < 0.5  # always drawn: the data must not depend on the override
    gc = drawn if global_commit is None else global_commit
    p = Pipeline(
        f"{shape.name}-{seed}",
        max_parallelism=rng.choice([8, 16, 128]),
        checkpoint=CheckpointConfig(
            interval=rng.choice([0.01, 0.03, 0.08]),
            storage=f"{d}/chk",
            mode=mode,
            **(alignment or {}),
            **(checkpoint or {}),
        ),
        restart=FixedDelayRestart(attempts=attempts, delay=0.0) if attempts else NoRestart(),
        buffers_per_channel=rng.choice([1, 2, 4]),
        state_backend=backend_config(backend, d),
    )
    build = Build(rng, f"{d}/out", scale, gc, rate, sink)
    shape.build(p, build)
    return p, build


def rows_of(table: pa.Table | None) -> list[tuple[Any, ...]]:
    if table is None:
        return []
    cols = sorted(table.column_names)
    return sorted(zip(*(table.column(c).to_pylist() for c in cols), strict=True))
