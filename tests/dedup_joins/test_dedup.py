"""Deduplication (``Stream.deduplicate``): output equal to a pure-Python reference over the whole input, on
both state backends; state that expires with the horizon; a duplicate after a restore still dropped; options
checked in one line. (Crashes: tests/dedup_joins/test_faults.py.)"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from sluice import CheckpointConfig, ConfigError, Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.errors import RestoreError
from sluice.keys import KeySelector
from sluice.operators.dedup import DeduplicateOperator
from sluice.sinks.testing import TwoPhaseCommitTestSink, read_committed
from sluice.state.api import ValueStateDescriptor

from tests.dedup_joins import data
from tests.dedup_joins.harness import Harness
from tests.dedup_joins.shapes import SHAPE
from tests.faults.backends import backend_config
from tests.faults.shapes import BACKENDS, pipeline_of, rows_of


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("keep", ["first", "last"])
@pytest.mark.parametrize("seed", [0, 1])
def test_deduplicate_equals_the_reference(backend: str, keep: str, seed: int, tmp_path: Path) -> None:
    """Keys recurring within and beyond the horizon, several splits and parallelisms: the committed rows are
    exactly the reference's (keep="first": each horizon's first record; "last": its greatest ``ord``)."""
    p = pipeline_of(SHAPE[f"dedup_{keep}"], seed, str(tmp_path), backend=backend)
    p.run(runtime="local", restore="none")
    got, expected = rows_of(read_committed(f"{tmp_path}/out")), p.reference()  # type: ignore[attr-defined]
    assert got == expected and len(expected) > 50


def test_processing_time_deduplication_keeps_each_keys_first_record(tmp_path: Path) -> None:
    """Without an event-time column the horizon is processing time: within an hour every key passes once."""
    src = GeneratorSource(num_splits=3, records_per_split=500, batch_size=37, num_keys=61)
    p = Pipeline("dedup-proc", checkpoint=CheckpointConfig(interval=0.05, storage=f"{tmp_path}/chk"))
    p.source(src).deduplicate("key", within="1 h", parallelism=2).sink(TwoPhaseCommitTestSink(f"{tmp_path}/out"))
    p.run(runtime="local", restore="none")
    got = read_committed(f"{tmp_path}/out")
    assert got is not None and sorted(got.column("key").to_pylist()) == list(range(61))


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("key_type", [pa.timestamp("ms"), pa.timestamp("ns", "UTC"), pa.date32()], ids=str)
def test_a_key_is_one_key_whether_or_not_its_batch_holds_a_null(backend: str, key_type: pa.DataType, tmp_path: Path) -> None:
    """Timestamp and date keys, at parallelism 2: every other batch holds null keys. Each distinct key (null
    included) passes once, as plain Python's first-seen set says. Before, a timestamp key hashed differently
    in a batch with a null (and by its column's unit), so its duplicates passed; date keys failed the job."""
    zoned = pa.types.is_timestamp(key_type) and key_type.tz is not None
    t0 = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC if zoned else None)

    def key(i: int) -> Any:
        day = t0 + datetime.timedelta(days=i % 40) + datetime.timedelta(milliseconds=i % 3)
        return day.date() if pa.types.is_date(key_type) else day

    def rows(split: int, start: int, end: int) -> pa.RecordBatch:
        seq = range(start, end)
        keys = [None if s % 10 == 0 and s // 20 % 2 == 0 else key(split * 1000 + s) for s in seq]  # batches of 20
        return pa.record_batch({"id": [split * 1000 + s for s in seq], "k": pa.array(keys, key_type)})

    src = GeneratorSource(num_splits=2, records_per_split=400, batch_size=20, rows=rows)
    expected = {row: None for split in range(2) for row in rows(split, 0, 400).column("k").to_pylist()}
    p = Pipeline(
        "dedup-null-keys", checkpoint=CheckpointConfig(interval=0.05, storage=f"{tmp_path}/chk"),
        state_backend=backend_config(backend, str(tmp_path)),
    )  # fmt: skip
    p.source(src).deduplicate("k", within="1 h", parallelism=2).sink(TwoPhaseCommitTestSink(f"{tmp_path}/out"))
    p.run(runtime="local", restore="none")
    got = read_committed(f"{tmp_path}/out")
    assert got is not None
    keys = got.column("k").to_pylist()
    assert len(keys) == len(set(keys)), "a key passed twice"
    assert set(keys) == set(expected) and len(expected) > 30


def _events(ids: list[int], keys: list[tuple[str, int]], ts: list[int]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({
        "id": ids, "a": [k[0] for k in keys], "b": [k[1] for k in keys],
        "ts": pa.array([datetime.datetime.fromtimestamp(t / 1000, datetime.UTC) for t in ts], pa.timestamp("ms", "UTC")),
    })  # fmt: skip


def held(op: DeduplicateOperator) -> int:
    """Horizon starts in the operator's state (every time bucket)."""
    names = [n for n in op.backend.state_meta() if n.startswith("horizon@")]
    return sum(1 for n in names for _ in op.backend.keys(n))


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_state_expires_with_the_horizon_and_survives_a_restore(backend: str) -> None:
    """Two key columns, a timestamp column, a 1 s horizon: duplicates inside it are dropped, also after a
    restore; once the watermark passes a horizon's end its state is gone and the key passes again."""
    def make() -> DeduplicateOperator:
        return DeduplicateOperator("dedup", KeySelector(["a", "b"]), 1000, "ts")

    keys = [("x", i % 1500) for i in range(3000)]
    first = _events(list(range(3000)), keys, [10_000 + i // 3 for i in range(3000)])  # key j: 500 ms apart
    h = Harness(make, backend)
    h.op.process_batch(first)
    assert [r["id"] for r in h.out.rows()] == list(range(1500))
    h.restart()
    h.op.process_batch(_events([5000, 5001], [("x", 7), ("y", 7)], [10_900, 10_900]))
    assert [r["id"] for r in h.out.rows()] == [5001], "a duplicate after the restore passed"
    h.op.close()

    h = Harness(make, backend)
    h.op.process_batch(first)
    assert len(h.out.rows()) == 1500
    assert held(h.op) == 1500
    h.op.process_watermark(11_000)  # no horizon ended yet (the latest opened at 10 499)
    assert held(h.op) == 1500
    h.op.process_watermark(20_000)  # every horizon ended: their time buckets are dropped whole
    assert held(h.op) == 0 and not [n for n in h.op.backend.state_meta() if n.startswith("horizon@")]
    h.op.process_batch(_events([6000, 6001], [("x", 7), ("x", 7)], [20_001, 20_002]))
    assert [r["id"] for r in h.out.rows()] == [6000]
    h.op.close()


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_a_checkpoint_of_the_earlier_keep_first_layout_is_refused_in_one_line(backend: str) -> None:
    """keep='first' state of an earlier sluice (one ``horizon_start`` per key) is not read by the time-bucket
    layout: restoring it is refused with one line naming the operator, never silently started empty (which
    would pass every key seen within the horizon again)."""
    h = Harness(lambda: DeduplicateOperator("dedup", KeySelector("k"), 1000, "ts"), backend)
    start = h.op.backend.batch_state(ValueStateDescriptor("horizon_start", serializer="int64"))
    start.put(h.op.backend.key_batch([pa.array([7])]), pa.array([0]))
    with pytest.raises(RestoreError) as err:
        h.restart()
    assert "deduplicate 'dedup': the checkpoint holds keep='first' state in the layout of an earlier" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_keep_last_emits_each_horizon_when_it_closes(backend: str) -> None:
    """keep="last": nothing before the horizon's end; then the record with the greatest ``ord`` (the later
    on a tie), also when the best was stored before a restore; a key's next horizon closes the previous."""
    h = Harness(lambda: DeduplicateOperator("dedup", KeySelector("k"), 100, "ts", "last", "ord"), backend)

    def batch(rows: list[tuple[int, int, int, int]]) -> pa.RecordBatch:
        return pa.RecordBatch.from_pylist([{"id": i, "k": k, "ts": t, "ord": o} for i, k, t, o in rows], schema=data.EVENTS)

    h.op.process_batch(batch([(1, 1, 0, 5), (2, 1, 10, 9), (3, 2, 20, 1), (4, 1, 30, 9)]))
    h.op.process_watermark(50)
    assert h.out.rows() == []
    h.restart()
    h.op.process_batch(batch([(5, 1, 60, 7), (6, 2, 130, 0)]))  # key 2: row 6 opens the next horizon
    assert [r["id"] for r in h.out.rows()] == [3]
    h.op.process_watermark(100)
    assert [r["id"] for r in h.out.rows()] == [4]
    h.op.end_input()
    assert [r["id"] for r in h.out.rows()] == [6]
    h.op.close()


def test_options_are_checked_when_the_job_is_built(tmp_path: Path) -> None:
    p = Pipeline("dedup-options", checkpoint=CheckpointConfig(storage=f"{tmp_path}/chk"))
    s = p.source(GeneratorSource(num_splits=1, records_per_split=10))
    cases: list[tuple[dict[str, Any], str]] = [
        ({"keys": "key", "within": 0}, "deduplicate: within: must be a duration > 0"),
        ({"keys": "key", "within": "1 h", "keep": "middle"}, "deduplicate: keep: 'middle' is not allowed (allowed: 'first', 'last')"),
        ({"keys": "key", "within": "1 h", "keep": "last"}, "deduplicate: keep='last' needs order_by=<column>"),
        ({"keys": "nope", "within": "1 h"}, "deduplicate: keys: column 'nope' is not in the stream"),
        ({"keys": "key", "within": "1 h", "event_time": "when"}, "deduplicate: event_time: column 'when' is not in the stream"),
        ({"keys": "key", "within": "a while"}, "deduplicate: within: 'a while' is not a duration: give a number of seconds, a timedelta"),
    ]  # fmt: skip
    for kw, message in cases:
        with pytest.raises(ConfigError) as err:
            s.deduplicate(**kw)
        assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_the_bloom_filter_never_misses_a_key_and_seldom_holds_a_new_one() -> None:
    """The per-bucket filter that spares new keys a state read: every added hash is held, across growing
    segments; under 1% of hashes never added are (it is sized for 32 bits per key)."""
    from sluice.operators.horizons import Bloom, _mix

    bloom = Bloom(1000)
    added = _mix(np.arange(300_000, dtype=np.uint64))
    for part in np.array_split(added, 7):
        bloom.add(Bloom.probe(part))
    assert len(bloom) == 300_000 and bloom.may_hold(Bloom.probe(added)).all()
    fresh = _mix(np.arange(10**9, 10**9 + 200_000, dtype=np.uint64))
    assert bloom.may_hold(Bloom.probe(fresh)).mean() < 0.01
