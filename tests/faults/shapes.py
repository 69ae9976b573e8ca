"""Deterministic pipeline shapes for the fault-injection suite, and the scenario runner.

Each shape's committed output is a set of rows that does not depend on thread interleavings: keys are
derived from (split, seq) so all rows of a key come from one split, in order, through FIFO channels; the
keyed operator emits, per row, the running count and sum of its key. A failure-free run of the same shape
gives the reference.
"""

from __future__ import annotations

import random
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from sluice import (
    CheckpointConfig,
    FixedDelayRestart,
    KeyedProcessFunction,
    Pipeline,
    ValueStateDescriptor,
)
from sluice.connectors.generator import GeneratorSource
from sluice.sinks.testing import TwoPhaseCommitTestSink, read_committed
from sluice.testing.faults import FaultInjector

SCENARIO_LOG: list[dict[str, Any]] = []


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
    build: Callable[[Pipeline, random.Random, str], None]


def _gen(rng: random.Random, name: str = "generator", offset: int = 0) -> GeneratorSource:
    splits = rng.randint(1, 5)
    per_split = rng.choice([200, 400, 700])

    def rows(split: int, start: int, end: int) -> pa.RecordBatch:
        from sluice.connectors.generator import default_rows

        b = default_rows(split, start, end, per_split, 50, 10)
        return b.set_column(0, "id", pc.add(b.column("id"), offset))

    return GeneratorSource(
        num_splits=splits,
        records_per_split=per_split,
        batch_size=rng.choice([10, 25, 60]),
        rows=rows,
        name=name,
    )


def _p(rng: random.Random) -> int:
    return rng.randint(1, 4)


def chain(p: Pipeline, rng: random.Random, out: str) -> None:
    s = p.source(_gen(rng))
    s = s.map_batches(lambda b: b.append_column("double", pc.multiply(b.column("value"), 2)))
    s.filter(pc.field("value") >= 0).sink(TwoPhaseCommitTestSink(out))


def keyed(p: Pipeline, rng: random.Random, out: str) -> None:
    s = p.source(_gen(rng), parallelism=_p(rng)).map_batches(with_key)
    s.key_by("k").process(RunningCount(), parallelism=_p(rng)).sink(
        TwoPhaseCommitTestSink(out), parallelism=_p(rng)
    )


def union(p: Pipeline, rng: random.Random, out: str) -> None:
    # forward edges into the union keep each split's rows on one FIFO path, so per-key order is fixed
    par = _p(rng)
    a = p.source(_gen(rng, "gen-a"), parallelism=par).map_batches(with_key, name="key-a", parallelism=par)
    b = p.source(_gen(rng, "gen-b", offset=10**9), parallelism=par)
    b = b.map_batches(
        lambda x: with_key(x).set_column(6, "k", pc.add(with_key(x).column("k"), 10**6)),
        name="key-b",
        parallelism=par,
    )
    u = a.union(b, parallelism=par)
    u.key_by("k").process(RunningCount(), parallelism=_p(rng)).sink(TwoPhaseCommitTestSink(out))


def rebalanced(p: Pipeline, rng: random.Random, out: str) -> None:
    s = p.source(_gen(rng), parallelism=_p(rng)).rebalance(parallelism=_p(rng))
    s.map_batches(lambda b: b.select(["id", "value"])).sink(TwoPhaseCommitTestSink(out), parallelism=_p(rng))


def two_keyed(p: Pipeline, rng: random.Random, out: str) -> None:
    s = p.source(_gen(rng), parallelism=_p(rng)).map_batches(with_key)
    s = s.key_by("k").process(RunningCount(), parallelism=_p(rng))
    s = s.map_batches(lambda b: b.append_column("value", b.column("count")), name="again")
    s.key_by("k").process(RunningCount(), name="second", parallelism=_p(rng)).sink(
        TwoPhaseCommitTestSink(out, global_commit=rng.random() < 0.5)
    )


SHAPES = [
    Shape("chain", chain),
    Shape("keyed", keyed),
    Shape("union", union),
    Shape("rebalance", rebalanced),
    Shape("two_keyed", two_keyed),
]


def run_shape(
    shape: Shape,
    seed: int,
    faults: FaultInjector | None,
    mode: str = "exactly_once",
    alignment: dict[str, Any] | None = None,
    attempts: int = 6,
) -> pa.Table | None:
    """Build ``shape`` with ``seed`` and run it to the end; return the committed output."""
    rng = random.Random(seed)
    d = tempfile.mkdtemp(prefix=f"sluice-{shape.name}-{seed}-")
    p = Pipeline(
        f"{shape.name}-{seed}",
        max_parallelism=rng.choice([8, 16, 128]),
        checkpoint=CheckpointConfig(
            interval=rng.choice([0.01, 0.03, 0.08]), storage=f"{d}/chk", mode=mode, **(alignment or {})
        ),
        restart=FixedDelayRestart(attempts=attempts, delay=0.0),
        buffers_per_channel=rng.choice([1, 2, 4]),
    )
    shape.build(p, rng, f"{d}/out")
    p.run(runtime="local", faults=faults, restore="none")
    return read_committed(f"{d}/out")


def rows_of(table: pa.Table | None) -> list[tuple[Any, ...]]:
    if table is None:
        return []
    cols = sorted(table.column_names)
    return sorted(zip(*(table.column(c).to_pylist() for c in cols), strict=True))
