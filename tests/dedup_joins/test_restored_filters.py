"""Deduplication after a restore keeps its Bloom filters (issue 34): a restored subtask, at the same or another
parallelism, still drops every key its state holds, and reads no state for keys it never saw (state reads
are counted under the operator, at the keyed backend)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from sluice.keys import KeySelector
from sluice.operators.base import OperatorContext
from sluice.operators.dedup import DeduplicateOperator
from sluice.state.config import StateBackendConfig
from sluice.state.delegating import DelegatingKeyedStateBackend
from sluice.state.factory import state_backend_for
from sluice.state.keygroups import KeyGroupRange, key_group_range, subtask_for_key_groups
from sluice.state.spi import BatchValueState, KeyBatch, KeyedStateBackend, StateBackend
from sluice.state.transfer import FileTransfer, LocalFileTransfer

from tests.dedup_joins.harness import Collected
from tests.faults.backends import BACKENDS

MAX_PARALLELISM = 16
WITHIN = 1000  # ms: time buckets of 250 ms


class _CountedState(BatchValueState):
    def __init__(self, inner: BatchValueState, reads: list[int]) -> None:
        self.inner, self.reads = inner, reads

    def get(self, keys: KeyBatch) -> pa.Array:
        self.reads[0] += len(keys)
        return self.inner.get(keys)

    def put(self, keys: KeyBatch, values: pa.Array) -> None:
        self.inner.put(keys, values)

    def insert(self, keys: KeyBatch, values: pa.Array) -> None:
        self.inner.insert(keys, values)

    def delete(self, keys: KeyBatch) -> None:
        self.inner.delete(keys)


class _Counted(DelegatingKeyedStateBackend):
    """Counts the keys every batch-wise state read asks for."""

    def __init__(self, delegate: KeyedStateBackend) -> None:
        super().__init__(delegate)
        self.reads = [0]

    def batch_state(self, descriptor: Any) -> BatchValueState:
        return _CountedState(self.delegate.batch_state(descriptor), self.reads)


class _CountingBackend(StateBackend):
    def __init__(self, inner: StateBackend) -> None:
        super().__init__(inner.config)
        self.inner = inner

    def create_keyed_backend(
        self, owner: str, key_groups: KeyGroupRange, max_parallelism: int, transfer: FileTransfer,
        clock: Callable[[], int] | None = None,
    ) -> KeyedStateBackend:  # fmt: skip
        return _Counted(self.inner.create_keyed_backend(owner, key_groups, max_parallelism, transfer, clock))


def _batch(keys: list[Any], ts: list[int]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"k": keys, "ts": pa.array(ts, pa.int64())})


class _Job:
    """``parallelism`` subtasks of one dedup operator, each fed the rows of its key groups."""

    def __init__(self, backend: StateBackend, files: FileTransfer, parallelism: int, restore: list[dict[str, Any]]) -> None:
        self.parallelism = parallelism
        self.ops: list[DeduplicateOperator] = []
        self.out: list[Collected] = []
        for i in range(parallelism):
            op, out = DeduplicateOperator("dedup", KeySelector("k"), WITHIN, "ts"), Collected()
            ctx = OperatorContext(
                name="dedup", subtask=i, parallelism=parallelism, max_parallelism=MAX_PARALLELISM,
                key_groups=key_group_range(MAX_PARALLELISM, parallelism, i), job_id="filters", attempt=0,
                state_backend=backend, state_files=files,
            )  # fmt: skip
            op.setup(ctx, out)
            op.initialize_state(restore, [None] * len(restore))
            op.open()
            self.ops.append(op)
            self.out.append(out)

    def feed(self, batch: pa.RecordBatch) -> list[Any]:
        """Route ``batch`` by key group; the keys that passed."""
        groups = KeyBatch.of([batch.column("k")], MAX_PARALLELISM).key_groups
        owner = subtask_for_key_groups(groups, MAX_PARALLELISM, self.parallelism)
        for i, op in enumerate(self.ops):
            mine = batch.filter(pa.array(owner == i))
            if mine.num_rows:
                op.process_batch(mine)
        return sorted(r["k"] for out in self.out for r in out.rows())

    def reads(self) -> int:
        return sum(op.backend.reads[0] for op in self.ops)  # type: ignore[attr-defined]

    def checkpoint(self, checkpoint_id: int) -> list[dict[str, Any]]:
        handles = []
        for op in self.ops:
            snap = op.snapshot_state(checkpoint_id)
            assert snap.keyed is not None
            handles.append(snap.keyed.run())
            op.close()
        return handles


@pytest.mark.parametrize(
    ("backend", "before", "after", "key_type"),
    [
        ("hashmap", 2, 2, "int"),
        ("rocksdb", 2, 2, "int"),
        ("hashmap", 2, 3, "int"),
        ("rocksdb", 2, 3, "string"),
        ("hashmap", 3, 1, "string"),
        ("rocksdb+changelog", 3, 1, "int"),  # the filters' scan goes through the changelog wrapper
    ],
)
def test_a_restored_subtask_knows_every_restored_key_and_reads_no_state_for_new_ones(
    backend: str, before: int, after: int, key_type: str
) -> None:
    config = StateBackendConfig(**(BACKENDS[backend] or {}))
    counting = _CountingBackend(state_backend_for(config))
    files = LocalFileTransfer(tempfile.mkdtemp(prefix="sluice-filters-"))

    def key(i: int) -> Any:
        return i if key_type == "int" else f"user-{i}"

    n = 2000
    seen = [key(i) for i in range(n)]
    times = [i * WITHIN // n for i in range(n)]  # every time bucket of the horizon holds keys
    job = _Job(counting, files, before, [])
    assert job.feed(_batch(seen, times)) == sorted(seen)
    handles = job.checkpoint(1)

    job = _Job(counting, files, after, handles)
    assert sum(len(op._horizons.buckets) for op in job.ops) == 4 * after  # type: ignore[union-attr]
    assert job.reads() == 0
    fresh = [key(i) for i in range(10**6, 10**6 + n)]
    assert job.feed(_batch(fresh, [WITHIN] * n)) == sorted(fresh)
    # each new key is looked up in every restored bucket: without filters that is 4 reads per key
    assert job.reads() <= n * 4 // 100, f"{job.reads()} state reads for {n} new keys"
    assert job.feed(_batch(seen, [WITHIN - 1] * n)) == [], "a key the restored state holds passed again"
    for op in job.ops:
        op.close()


def test_key_hashes_are_the_same_for_a_fixed_width_matrix_and_for_the_same_bytes_in_a_list() -> None:
    """A batch holds int keys as a fixed-width matrix unless a null is among them: the filter's hash of a key
    must not depend on which (a restore hashes the stored bytes)."""
    from sluice.operators.horizons import key_hashes

    fixed = KeyBatch.of([pa.array(np.arange(-500, 500))], MAX_PARALLELISM)
    assert fixed.fixed is not None
    listed = KeyBatch(list(fixed.keys), fixed.key_groups)
    assert (key_hashes(fixed) == key_hashes(listed)).all()
    assert len(set(key_hashes(fixed).tolist())) == 1000
    mixed = KeyBatch.of([pa.array(["a", "bb", "a", "ccc", None])], MAX_PARALLELISM)
    h = key_hashes(mixed).tolist()
    assert h[0] == h[2] and len(set(h)) == 4
