"""Judges of benchmark outputs computed from the input, apart from sluice's own counters.

* :func:`generator_rows`: what ``GeneratorSource`` emits (its default columns), recomputed from the
  formula in its docstring, not by calling it;
* :func:`check_generator_output`: a job's output from a generator against that formula: every row's
  columns right for its ``id``, no row twice, and (``complete``) every row of the input there, or (for a
  cancelled unbounded job) every split's rows a prefix of its input up to a bound;
* :func:`ceiling_rows`: the messages ``benchmarks/kafka_ceiling.py`` produces, as rows, from its format;
* :class:`IdSink`: a light two-phase-commit sink that stages the ``id`` column of each checkpoint in a
  ``.npy`` file and publishes it by a rename, for jobs whose figure is not about the sink (a counting sink
  would leave nothing to check against the input).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from sluice.sink import CommitOutcome, Committer, Sink, SinkWriter

__all__ = ["IdSink", "ceiling_rows", "check_generator_output", "generator_rows", "read_ids"]

#: ``ts`` of a generator row: this plus ``seq * step_ms`` (connectors/sluice/connectors/generator.py)
_T0 = 1_600_000_000_000
#: ``records_per_split`` an unbounded generator numbers its splits' ids by
UNBOUNDED = 2**40


def generator_rows(splits: int, per_split: int, num_keys: int, step_ms: int = 10) -> pa.Table:
    """Every row a bounded ``GeneratorSource(num_splits=splits, records_per_split=per_split,
    num_keys=num_keys, step_ms=step_ms)`` emits, computed from its documented formula: row ``seq`` of split
    ``s`` has ``id = s * per_split + seq``, ``key = id % num_keys``, ``value = id * 7 % 1000``, ``ts = T0 +
    seq * step_ms``."""
    seq = np.tile(np.arange(per_split, dtype=np.int64), splits)
    split = np.repeat(np.arange(splits, dtype=np.int64), per_split)
    ids = split * per_split + seq
    return pa.table({"split": split.astype(np.int32), "id": ids, "key": ids % num_keys, "value": ids * 7 % 1000,
                     "ts": _T0 + seq * step_ms})  # fmt: skip


def check_generator_output(
    got: pa.Table,
    splits: int,
    num_keys: int,
    per_split: int | None = None,
    *,
    step_ms: int = 10,
    label: str = "output",
) -> dict[str, int]:
    """Check ``got`` (columns ``id`` and any of ``split``, ``key``, ``value``, ``ts``) against the generator's
    formula; raise ``RuntimeError`` naming what differs.

    With ``per_split`` (a bounded source run to its end) the output must hold every input row exactly once.
    Without (an unbounded source, ids numbered by :data:`UNBOUNDED`, job cancelled) each split's rows must be
    its first ``n`` rows for some ``n`` (no row twice, no gap). Returns ``{"rows": ..., "splits": ...}``."""
    stride = per_split if per_split is not None else UNBOUNDED
    ids = got.column("id").to_numpy().astype(np.int64)
    split, seq = ids // stride, ids % stride
    if len(ids) and (split.min() < 0 or split.max() >= splits):
        raise RuntimeError(f"{label}: ids outside the input's {splits} splits")
    expect = {"split": split, "key": ids % num_keys, "value": ids * 7 % 1000, "ts": _T0 + seq * step_ms}
    for col, want in expect.items():
        if col in got.column_names and not np.array_equal(got.column(col).to_numpy().astype(np.int64), want):
            raise RuntimeError(f"{label}: column {col!r} differs from the input's for the same id")
    if len(np.unique(ids)) != len(ids):
        raise RuntimeError(f"{label}: {len(ids) - len(np.unique(ids))} rows written more than once")
    counts = np.bincount(split, minlength=splits) if len(ids) else np.zeros(splits, np.int64)
    if per_split is not None:
        if len(ids) != splits * per_split:
            raise RuntimeError(f"{label}: {len(ids)} rows, the input has {splits * per_split}")
    else:
        for s in range(splits):
            top = int(seq[split == s].max()) + 1 if counts[s] else 0
            if top != counts[s]:
                raise RuntimeError(f"{label}: split {s} has {counts[s]} rows but reaches row {top - 1}: a gap")
    return {"rows": len(ids), "splits": int((counts > 0).sum())}


def ceiling_rows(n: int) -> pa.Table:
    """The ``n`` messages of ``kafka_ceiling.produce`` as the rows a JSON decoder must give: message ``i`` has
    ``id = i``, ``ts = 1_700_000_000_000 + i``, ``user = "user-%06d" % (i % 100_000)``, ``event = "click"``,
    ``amount = i % 1000 + 0.25`` and a 30-byte ``payload`` of ``x``."""
    i = np.arange(n, dtype=np.int64)
    users = np.char.add("user-", np.char.zfill((i % 100_000).astype(str), 6))
    return pa.table({
        "id": i, "ts": 1_700_000_000_000 + i, "user": pa.array(users.astype(object), pa.string()),
        "event": pa.array(np.full(n, "click", dtype=object), pa.string()), "amount": (i % 1000) + 0.25,
        "payload": pa.array(np.full(n, "x" * 30, dtype=object), pa.string()),
    })  # fmt: skip


class IdSink(Sink[str]):
    """Stages the ``id`` column (and ``split``, when present) of each checkpoint in a ``.npy`` file under
    ``root/.staged`` and commits it by a rename into ``root``: cheap, and its output can be read back."""

    name = "ids"

    def __init__(self, root: str) -> None:
        self.root = root

    def create_writer(self, ctx: Any, restored: list[Any]) -> SinkWriter[str]:
        return _IdWriter(self.root, ctx.subtask, ctx.attempt)

    def create_committer(self, ctx: Any) -> Committer[str]:
        return _IdCommitter()


class _IdWriter(SinkWriter[str]):
    def __init__(self, root: str, subtask: int, attempt: int) -> None:
        self.root, self.name = root, f"{subtask}-{attempt}"
        self.parts: list[np.ndarray] = []
        os.makedirs(f"{root}/.staged", exist_ok=True)

    def write(self, batch: pa.RecordBatch) -> None:
        self.parts.append(batch.column("id").to_numpy(zero_copy_only=False))

    def prepare_commit(self, checkpoint_id: int) -> list[str]:
        if not self.parts:
            return []
        path = f"{self.root}/.staged/{self.name}-{checkpoint_id}.npy"
        np.save(path, np.concatenate(self.parts))
        self.parts = []
        return [path]


class _IdCommitter(Committer[str]):
    def commit(self, committables: Sequence[str]) -> CommitOutcome:
        done = True
        for path in committables:
            target = Path(path).parent.parent / Path(path).name
            if os.path.exists(path):
                os.replace(path, target)
                done = False
        return CommitOutcome.ALREADY_COMMITTED if done and committables else CommitOutcome.COMMITTED


def read_ids(root: str) -> pa.Table:
    """The ids an :class:`IdSink` committed (staged files left out)."""
    files = sorted(f for f in os.listdir(root) if f.endswith(".npy")) if os.path.isdir(root) else []
    ids = np.concatenate([np.load(f"{root}/{f}") for f in files]) if files else np.zeros(0, np.int64)
    return pa.table({"id": pc.cast(pa.array(ids), pa.int64())})
