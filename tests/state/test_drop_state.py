"""Dropping a whole state (``KeyedStateBackend.drop_state``, how deduplication expires a time bucket) and
writing past the cache (``BatchValueState.insert``), on both backends: through checkpoints, restores,
rescales and changelog checkpoints; an earlier checkpoint still holds what was dropped after it."""

from __future__ import annotations

import pyarrow as pa
import pytest
from sluice.state.api import ValueStateDescriptor
from sluice.state.spi import Handle, KeyedStateBackend

from tests.state.conftest import BACKENDS, MakeBackend
from tests.state.test_backends import kg_of

OLD = ValueStateDescriptor("bucket@1", serializer="int64")
NEW = ValueStateDescriptor("bucket@12", serializer="int64")  # a name that the first one is a prefix of
KEYS = list(range(400))


def owned(be: KeyedStateBackend) -> list[int]:
    return [k for k in KEYS if kg_of(k) in be.key_groups]


def values(be: KeyedStateBackend, desc: ValueStateDescriptor) -> dict[int, int]:
    """Every value of ``desc`` this subtask owns (read batch-wise)."""
    keys = owned(be)
    got = be.batch_state(desc).get(be.key_batch([pa.array(keys, pa.int64())])).to_pylist()
    return {k: v for k, v in zip(keys, got, strict=True) if v is not None}


def fill(be: KeyedStateBackend) -> None:
    keys = owned(be)
    batch = be.key_batch([pa.array(keys, pa.int64())])
    be.batch_state(OLD).get(batch)  # read first: the RocksDB cache now knows them as absent
    be.batch_state(OLD).insert(batch, pa.array([k * 10 for k in keys], pa.int64()))
    be.batch_state(NEW).put(batch, pa.array(keys, pa.int64()))


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("options", [{}, {"changelog": True}], ids=["plain", "changelog"])
@pytest.mark.parametrize(("old", "new"), [(1, 1), (1, 2), (2, 3)])
def test_a_dropped_state_is_gone_through_checkpoints_restores_and_rescales(
    kind: str, options: dict[str, object], old: int, new: int, make_backend: MakeBackend
) -> None:
    before: list[Handle] = []
    after: list[Handle] = []
    for i in range(old):
        be = make_backend(kind, parallelism=old, index=i, **options)
        fill(be)
        assert values(be, OLD) == {k: k * 10 for k in owned(be)}, "insert reads back as put does"
        before.append(be.snapshot(1).run())
        be.notify_checkpoint_complete(1)
        be.drop_state(OLD.name)
        assert OLD.name not in be.state_meta() or options, "a dropped state leaves the state meta"
        assert values(be, OLD) == {} and not list(be.keys(OLD.name))
        assert values(be, NEW) == {k: k for k in owned(be)}, "a state whose name starts alike is kept"
        after.append(be.snapshot(2).run())
    for i in range(new):
        be = make_backend(kind, parallelism=new, index=i, **options)
        be.restore(after)
        assert values(be, OLD) == {} and values(be, NEW) == {k: k for k in owned(be)}
        be = make_backend(kind, parallelism=new, index=i, **options)
        be.restore(before)
        assert values(be, OLD) == {k: k * 10 for k in owned(be)}, "the earlier checkpoint lost the dropped state"


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_state_dropped_and_made_again_starts_empty(kind: str, make_backend: MakeBackend) -> None:
    be = make_backend(kind)
    fill(be)
    be.drop_state(OLD.name)
    be.drop_state("never-made")  # nothing to drop: no error
    batch = be.key_batch([pa.array([1, 2], pa.int64())])
    state = be.batch_state(OLD)
    assert state.get(batch).to_pylist() == [None, None]
    state.insert(batch, pa.array([7, 8], pa.int64()))
    restored = make_backend(kind)
    restored.restore([be.snapshot(3).run()])
    assert restored.batch_state(OLD).get(batch).to_pylist() == [7, 8]
    assert values(restored, NEW) == {k: k for k in KEYS}
