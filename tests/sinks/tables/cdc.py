"""A change-data job under test: a source of Arrow change batches (inserts, updates, deletes and snapshot
reads of a few keys per split, many changes per key), a DeltaSink or IcebergSink in upsert mode, and a
reference written apart from the code under test: the whole stream applied to a dict, change by change.

Keys belong to one split, and a split's changes are read in order, so the changes of a key arrive in source
order (as a Kafka partition's do); ``_sluice_order`` is the position in the split. The source ends its input
only after ``LINGER_CHECKPOINTS`` completed checkpoints (tests/faults/shapes.py), so checkpoint-driven fault
points are reached in every attempt.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from sluice import CheckpointConfig, FixedDelayRestart, NoRestart, Pipeline
from sluice.changes import OP, ORDER, Op, with_keys
from sluice.connectors.generator import GeneratorSource
from sluice.source import InputStatus, ReaderContext, ReaderOutput, SourceReader

from tests.faults.shapes import _Lingering, _LingeringReader
from tests.sinks.tables.helpers import Target

Row = tuple[str | None, float | None]
State = dict[int, Row]

#: keys per split: few, so a key changes many times, often several times in one checkpoint
KEYS_PER_SPLIT = 12


def op_of(split: int, seq: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The operation of change ``seq`` of ``split``: 20% deletes, 20% inserts, 10% reads, 50% updates."""
    r = (seq * 2654435761 + split * 40503) % 1000 // 100
    return np.select([r < 2, r < 4, r < 5], [int(Op.DELETE), int(Op.INSERT), int(Op.READ)], int(Op.UPDATE))


def key_of(split: int, seq: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return split * 1000 + (seq * 7919 + split * 13) % KEYS_PER_SPLIT


def change_rows(split: int, start: int, end: int, extra: int | None = None) -> pa.RecordBatch:
    """Changes ``start..end`` of ``split`` (a GeneratorSource ``rows`` function). From change ``extra`` on, the
    rows carry a new nullable column ``note`` (the source table gained a column)."""
    seq = np.arange(start, end, dtype=np.int64)
    ops = op_of(split, seq)
    deleted = ops == int(Op.DELETE)
    names = [None if d else f"s{split}-{s}" for s, d in zip(seq.tolist(), deleted.tolist(), strict=True)]
    amounts = np.where(deleted, np.nan, (seq % 97) * 1.5 + split)
    cols: dict[str, pa.Array] = {
        "id": pa.array(key_of(split, seq), pa.int64()),
        "name": pa.array(names, pa.string()),
        "amount": pa.array(amounts, pa.float64(), mask=deleted),
    }
    if extra is not None and start >= extra:
        cols["note"] = pa.array([None if d else f"note-{s}" for s, d in zip(seq.tolist(), deleted.tolist(), strict=True)], pa.string())
    cols[OP] = pa.array(ops, pa.int8())
    cols[ORDER] = pa.array(seq)
    return with_keys(pa.RecordBatch.from_pydict(cols), ["id"])


@dataclass(frozen=True)
class Stream:
    """A change stream: ``splits`` splits of ``per_split`` changes each."""

    splits: int
    per_split: int
    batch: int = 25
    extra: int | None = None  # from this position on, batches carry the new column ``note``

    def rows(self) -> Callable[[int, int, int], pa.RecordBatch]:
        """The source's ``rows`` function."""
        return functools.partial(change_rows, extra=self.extra)

    def source(self, rate: float | None = None, until: Callable[[], bool] | None = None) -> Any:
        """The stream as a source; given ``until``, its readers end their input only once ``until()`` holds
        (polled; ending anyway after ``HOLD_DEADLINE`` seconds, for the test's own check to fail)."""
        rows = self.rows()
        kw: dict[str, Any] = {
            "num_splits": self.splits,
            "records_per_split": self.per_split,
            "batch_size": self.batch,
            "rows": rows,
            "name": "changes",
            "rows_per_second": rate,
        }
        return _Lingering(**kw) if until is None else _Holding(until, **kw)

    def split_changes(self, split: int) -> list[tuple[int, int, Row]]:
        """``(key, op, row)`` of ``split`` in source order (the reference's input, read from the batches)."""
        b = change_rows(split, 0, self.per_split, self.extra)
        return list(
            zip(
                b.column("id").to_pylist(),
                b.column(OP).to_pylist(),
                zip(b.column("name").to_pylist(), b.column("amount").to_pylist(), strict=True),
                strict=True,
            )
        )

    def final(self) -> State:
        """The reference: every change applied to a dict, one after another, in source order."""
        state: State = {}
        for split in range(self.splits):
            replay(state, self.split_changes(split))
        return state

    def prefixes(self, split: int) -> dict[frozenset[tuple[int, Row]], int]:
        """Every state a prefix of ``split``'s changes leaves (its keys only), with the prefix's length."""
        state: State = {}
        out = {frozenset(): 0}
        for n, change in enumerate(self.split_changes(split), start=1):
            replay(state, [change])
            out.setdefault(frozenset(state.items()), n)
        return out


def plain_rows(split: int, start: int, end: int) -> pa.RecordBatch:
    """Changes ``start..end`` of ``split`` as plain rows, as a keyed JSON topic or a window's results carry
    them: no change columns, no key metadata, the deletes left out (each other change is a row of its key)."""
    b = change_rows(split, start, end)
    keep = np.asarray(b.column(OP).to_numpy()) != int(Op.DELETE)
    return b.filter(pa.array(keep)).drop_columns([OP, ORDER]).replace_schema_metadata(None)


@dataclass(frozen=True)
class PlainStream(Stream):
    """The stream as plain rows (:func:`plain_rows`): into an upsert sink given ``key_columns``, the table
    must hold the last row per key of the input, and every version a per-split prefix of it."""

    def rows(self) -> Callable[[int, int, int], pa.RecordBatch]:
        return plain_rows

    def split_changes(self, split: int) -> list[tuple[int, int, Row]]:
        """``(key, insert, row)`` of ``split``'s rows in source order (read from the batches)."""
        b = plain_rows(split, 0, self.per_split)
        rows = zip(b.column("name").to_pylist(), b.column("amount").to_pylist(), strict=True)
        return [(k, int(Op.INSERT), r) for k, r in zip(b.column("id").to_pylist(), rows, strict=True)]


#: seconds a source given ``until`` holds its end of input at most
HOLD_DEADLINE = 120.0


class _Holding(_Lingering):
    """A lingering change source whose readers also wait for ``until()`` before ending their input."""

    def __init__(self, until: Callable[[], bool], **kw: Any) -> None:
        super().__init__(**kw)
        self.until = until

    def create_reader(self, ctx: ReaderContext) -> SourceReader:
        return _HoldingReader(GeneratorSource.create_reader(self, ctx), self.until)


class _HoldingReader(_LingeringReader):
    def __init__(self, inner: SourceReader, until: Callable[[], bool]) -> None:
        super().__init__(inner)
        self.until = until
        self.released = False
        self.deadline: float | None = None
        self.polled = 0.0

    def poll_next(self, output: ReaderOutput) -> InputStatus:
        status = super().poll_next(output)
        if status is not InputStatus.END_OF_INPUT or self.released:
            return status
        now = time.monotonic()
        self.deadline = self.deadline or now + HOLD_DEADLINE
        if now - self.polled >= 0.1:  # the condition reads the table: not at every poll
            self.polled = now
            self.released = self.until() or now > self.deadline
        return status if self.released else InputStatus.NOTHING_AVAILABLE


def replay(state: State, changes: Iterable[tuple[int, int, Row]]) -> None:
    for key, op, row in changes:
        if op == Op.DELETE:
            state.pop(key, None)
        else:
            state[key] = row


def table_state(table: pa.Table) -> State:
    """A table read back as ``{id: (name, amount)}``; fails on a duplicated key."""
    if table.num_rows == 0:
        return {}
    ids = table.column("id").to_pylist()
    assert len(set(ids)) == len(ids), f"{len(ids) - len(set(ids))} duplicated key(s) in the table"
    return dict(zip(ids, zip(table.column("name").to_pylist(), table.column("amount").to_pylist(), strict=True), strict=True))


def version_states(target: Target) -> list[tuple[int | None, State]]:
    """Every table version (Delta log entries, Iceberg snapshots), oldest first: the checkpoint its commit
    recorded (None: not a checkpoint's, e.g. a rewrite or the table's creation) and what a reader sees."""
    out: list[tuple[int | None, State]] = []
    if not target.exists():
        return out
    if target.kind == "delta":
        from deltalake import DeltaTable

        table = target.delta_table()
        for v in range(table.version() + 1):
            t = DeltaTable(f"{target.root}/table", version=v, storage_options=target._delta_options())
            out.append((delta_txn(target, v), table_state(t.to_pyarrow_table())))
        return out
    table = target.iceberg_table()
    for s in table.snapshots():
        cid = s.summary.additional_properties.get("sluice.max-committed-checkpoint-id") if s.summary else None
        out.append((int(cid) if cid is not None else None, table_state(table.scan(snapshot_id=s.snapshot_id).to_arrow())))
    return out


def delta_txn(target: Target, version: int) -> int | None:
    """The app transaction version (the checkpoint) Delta log entry ``version`` records, read from the log
    file itself (delta-rs's ``history()`` hangs listing moto's S3 with ``start-after``)."""
    from sluice.sinks.tables.storage import arrow_filesystem

    fs, root = arrow_filesystem(f"{target.root}/table", target.storage_options)
    with fs.open_input_stream(f"{root}/_delta_log/{version:020d}.json") as f:
        for line in f.read().decode().splitlines():
            action = json.loads(line)
            if "txn" in action:
                return int(action["txn"]["version"])
    return None


def check_versions(stream: Stream, target: Target) -> int:
    """Assert every table version is the stream applied up to a cut (per split, a prefix of its changes: a
    checkpoint's source offsets) and carries a checkpoint id unless it only creates or rewrites the table;
    returns how many versions."""
    prefixes = [stream.prefixes(s) for s in range(stream.splits)]
    versions = version_states(target)
    for n, (cid, state) in enumerate(versions):
        for split in range(stream.splits):
            part = frozenset((k, r) for k, r in state.items() if k // 1000 == split)
            at = prefixes[split].get(part)
            assert at is not None, (
                f"table version {n} (checkpoint {cid}): split {split}'s keys are no prefix of its changes: {sorted(part)}"
            )
    return len(versions)


def pipeline(
    stream: Stream,
    sink: Any,
    directory: str,
    *,
    name: str = "cdc",
    parallelism: int = 2,
    interval: float = 0.05,
    attempts: int = 6,
    rate: float | None = None,
    checkpoint: dict[str, Any] | None = None,
    until: Callable[[], bool] | None = None,
    source: Any = None,
    sink_parallelism: int | None = None,
) -> Pipeline:
    """source -> sink, chained (the writers see each split's changes in source order); ``until``: see
    :meth:`Stream.source`; ``source``: another source of the stream's changes (e.g. paced by checkpoints);
    ``sink_parallelism``: the sink's, if not the source's (plain rows then cross a hash exchange)."""
    p = Pipeline(
        name,
        checkpoint=CheckpointConfig(interval=interval, storage=f"{directory}/chk", **(checkpoint or {})),
        restart=FixedDelayRestart(attempts=attempts, delay=0.0) if attempts else NoRestart(),
    )
    p.source(source or stream.source(rate, until), parallelism=parallelism).sink(
        sink, parallelism=sink_parallelism or parallelism
    )
    return p
