"""Restore and rescale by key group on both backends, and switching backends through a savepoint."""

from __future__ import annotations

import pytest
from sluice.errors import RestoreError
from sluice.state.api import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from sluice.state.keycodec import decode_key, encode_key
from sluice.state.spi import Handle, KeyedStateBackend, TimeDomain

from tests.state.conftest import BACKENDS, MakeBackend
from tests.state.test_backends import at, kg_of

VALUE = ValueStateDescriptor("value", serializer="int64")
LIST = ListStateDescriptor("list", serializer="string")
MAP = MapStateDescriptor("map", serializer="float64", key_serializer="int64")
KEYS = range(300)


def fill(be: KeyedStateBackend) -> None:
    """Every key of ``KEYS`` this subtask owns gets a value, a list, a map and a timer."""
    for k in KEYS:
        if kg_of(k) not in be.key_groups:
            continue
        at(be, k)
        be.state(VALUE).update(k * 10)
        be.state(LIST).add_all([str(k), "x"])
        be.state(MAP).put(k, k / 2)
        be.timers.register(TimeDomain.EVENT, 5000 + k, kg_of(k), encode_key(k))


def check(be: KeyedStateBackend) -> None:
    """Exactly the keys this subtask owns are there, with their values and timers."""
    owned = [k for k in KEYS if kg_of(k) in be.key_groups]
    for k in owned:
        at(be, k)
        assert be.state(VALUE).value() == k * 10
        assert be.state(LIST).get() == [str(k), "x"]
        assert dict(be.state(MAP).items()) == {k: k / 2}
    assert sorted(k for _, k in be.keys("value")) == owned
    assert all(kg in be.key_groups for kg, _ in be.keys("map"))
    timers = sorted(be.timers.timers(TimeDomain.EVENT))
    assert [(t.timestamp, decode_key(t.key)) for t in timers] == sorted((5000 + k, k) for k in owned)


def snapshots(make_backend: MakeBackend, kind: str, parallelism: int, savepoint: bool = False) -> list[Handle]:
    handles = []
    for i in range(parallelism):
        be = make_backend(kind, parallelism=parallelism, index=i)
        fill(be)
        handles.append(be.snapshot(7, savepoint=savepoint).run())
    return handles


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize(("old", "new"), [(1, 1), (1, 2), (2, 1), (3, 2), (2, 3)])
def test_restore_and_rescale_by_key_group(kind: str, old: int, new: int, make_backend: MakeBackend) -> None:
    handles = snapshots(make_backend, kind, old)
    for i in range(new):
        be = make_backend(kind, parallelism=new, index=i)
        be.restore(handles)
        check(be)


@pytest.mark.parametrize(("source", "target"), [("hashmap", "rocksdb"), ("rocksdb", "hashmap"), ("rocksdb", "rocksdb")])
@pytest.mark.parametrize(("old", "new"), [(1, 1), (2, 3)])
def test_savepoints_switch_backends(source: str, target: str, old: int, new: int, make_backend: MakeBackend) -> None:
    handles = snapshots(make_backend, source, old, savepoint=True)
    assert all(h["format"] == "canonical" for h in handles)
    for i in range(new):
        be = make_backend(target, parallelism=new, index=i)
        be.restore(handles)
        check(be)
        again = be.snapshot(8, savepoint=True).run()  # and back out in the canonical format
        other = make_backend(source, parallelism=new, index=i)
        other.restore([again])
        check(other)


def test_hashmap_refuses_a_native_rocksdb_checkpoint(make_backend: MakeBackend) -> None:
    handles = snapshots(make_backend, "rocksdb", 1)
    be = make_backend("hashmap")
    with pytest.raises(RestoreError, match="switch backends through a savepoint") as info:
        be.restore(handles)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("kind", BACKENDS)
def test_restored_state_nobody_read_yet_is_kept_in_the_next_snapshot(kind: str, make_backend: MakeBackend) -> None:
    first = make_backend(kind)
    fill(first)
    handle = first.snapshot(1).run()
    second = make_backend(kind)
    second.restore([handle])
    at(second, 0)
    second.state(VALUE).update(-1)  # only "value" is read; "list" and "map" stay as restored
    third = make_backend(kind)
    third.restore([second.snapshot(2).run()])
    at(third, 0)
    assert third.state(VALUE).value() == -1
    assert third.state(LIST).get() == ["0", "x"] and dict(third.state(MAP).items()) == {0: 0.0}


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_descriptor_that_does_not_fit_the_restored_state_is_refused(kind: str, make_backend: MakeBackend) -> None:
    be = make_backend(kind)
    fill(be)
    handle = be.snapshot(1).run()
    restored = make_backend(kind)
    restored.restore([handle])
    with pytest.raises(RestoreError, match=r"state 'value' was checkpointed as serializer int64, now string") as info:
        restored.state(ValueStateDescriptor("value", serializer="string"))
    assert "\n" not in str(info.value)
    with pytest.raises(RestoreError, match="list state, now value state"):
        restored.state(ValueStateDescriptor("list", serializer="string"))
