"""State TTL on both backends: expired values are never returned, the clock restarts on write (or read),
list elements and map entries expire one by one, and expired values are cleaned up in the background, on
restore and (if asked) from full snapshots and savepoints."""

from __future__ import annotations

import pyarrow as pa
import pytest
from sluice.errors import ConfigError, RestoreError
from sluice.state.api import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from sluice.state.config import StateTtlConfig
from sluice.state.spi import KeyedStateBackend

from tests.state.conftest import BACKENDS, Clock, MakeBackend
from tests.state.test_backends import at


def ttl(**options: object) -> StateTtlConfig:
    settings: dict[str, object] = {"ttl": 10.0, "cleanup_in_background": False, **options}
    return StateTtlConfig(**settings)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", BACKENDS)
def test_expired_values_are_never_returned(kind: str, make_backend: MakeBackend, clock: Clock) -> None:
    be = make_backend(kind)
    v = be.state(ValueStateDescriptor("v", -1, serializer="int64", ttl=ttl()))
    at(be, "a")
    v.update(1)
    clock.advance(9_999)
    assert v.value() == 1
    clock.advance(1)
    assert v.value() == -1
    at(be, "b")
    v.update(2)
    clock.advance(5_000)
    v.update(3)  # a write restarts the clock
    clock.advance(9_000)
    assert v.value() == 3


@pytest.mark.parametrize("kind", BACKENDS)
def test_on_read_and_write_restarts_the_clock_on_reads(kind: str, make_backend: MakeBackend, clock: Clock) -> None:
    be = make_backend(kind)
    v = be.state(ValueStateDescriptor("v", serializer="int64", ttl=ttl(update_type="on_read_and_write")))
    batch = be.batch_state(ValueStateDescriptor("v", serializer="int64", ttl=ttl(update_type="on_read_and_write")))
    at(be, "a")
    v.update(1)
    keys = be.key_batch([pa.array(["b"])])
    batch.put(keys, pa.array([2], pa.int64()))
    for _ in range(5):
        clock.advance(6_000)
        at(be, "a")
        assert v.value() == 1
        assert batch.get(keys).to_pylist() == [2]
    clock.advance(10_000)
    assert v.value() is None and batch.get(keys).to_pylist() == [None]


@pytest.mark.parametrize("kind", BACKENDS)
def test_return_expired_if_not_cleaned_up(kind: str, make_backend: MakeBackend, clock: Clock) -> None:
    be = make_backend(kind)
    v = be.state(ValueStateDescriptor("v", serializer="int64", ttl=ttl(visibility="return_expired_if_not_cleaned_up")))
    at(be, "a")
    v.update(1)
    clock.advance(20_000)
    assert v.value() == 1
    assert be.cleanup_expired(100) == 1
    assert v.value() is None


@pytest.mark.parametrize("kind", BACKENDS)
def test_list_elements_and_map_entries_expire_one_by_one(kind: str, make_backend: MakeBackend, clock: Clock) -> None:
    be = make_backend(kind)
    lst = be.state(ListStateDescriptor("l", serializer="int64", ttl=ttl()))
    m = be.state(MapStateDescriptor("m", serializer="string", key_serializer="int64", ttl=ttl()))
    at(be, 1)
    lst.add(1)
    m.put(1, "one")
    clock.advance(6_000)
    lst.add_all([2, 3])
    m.put(2, "two")
    assert lst.get() == [1, 2, 3] and dict(m.items()) == {1: "one", 2: "two"}
    clock.advance(6_000)
    assert lst.get() == [2, 3] and dict(m.items()) == {2: "two"}
    assert m.get(1) is None and not m.contains(1) and m.contains(2)
    clock.advance(6_000)
    assert lst.get() == [] and m.is_empty()


@pytest.mark.parametrize("kind", BACKENDS)
def test_batch_access_honours_ttl(kind: str, make_backend: MakeBackend, clock: Clock) -> None:
    be = make_backend(kind)
    batch = be.batch_state(ValueStateDescriptor("v", serializer="float64", ttl=ttl()))
    first = be.key_batch([pa.array(range(100))])
    batch.put(first, pa.array([0.5] * 100))
    clock.advance(5_000)
    second = be.key_batch([pa.array(range(50, 150))])
    batch.put(second, pa.array([1.5] * 100))
    clock.advance(6_000)
    got = batch.get(be.key_batch([pa.array(range(150))])).to_pylist()
    assert got == [None] * 50 + [1.5] * 100


def expired_entries(be: KeyedStateBackend, name: str) -> int:
    return sum(1 for _ in be.keys(name))


@pytest.mark.parametrize("kind", BACKENDS)
def test_background_cleanup_removes_expired_values_nobody_reads(kind: str, make_backend: MakeBackend, clock: Clock) -> None:
    be = make_backend(kind)
    desc = ValueStateDescriptor("v", serializer="int64", ttl=ttl(cleanup_in_background=True, cleanup_size=5))
    batch = be.batch_state(desc)
    batch.put(be.key_batch([pa.array(range(2000))]), pa.array(range(2000), pa.int64()))
    clock.advance(60_000)
    assert expired_entries(be, "v") == 2000  # expired, not yet removed
    other = be.key_batch([pa.array(range(10_000, 10_010))])
    for _ in range(400):  # accesses of the state drive the incremental cleanup
        batch.get(other)
    assert expired_entries(be, "v") < 2000
    while be.cleanup_expired(1000):
        pass
    assert expired_entries(be, "v") == 0


@pytest.mark.parametrize("kind", BACKENDS)
def test_expired_values_are_dropped_on_restore(kind: str, make_backend: MakeBackend, clock: Clock) -> None:
    be = make_backend(kind)
    desc = ValueStateDescriptor("v", serializer="int64", ttl=ttl())
    be.batch_state(desc).put(be.key_batch([pa.array(range(100))]), pa.array(range(100), pa.int64()))
    clock.advance(5_000)
    be.batch_state(desc).put(be.key_batch([pa.array(range(100, 150))]), pa.array(range(50), pa.int64()))
    savepoint = be.snapshot(1, savepoint=True).run()
    clock.advance(6_000)
    for target in BACKENDS:
        restored = make_backend(target)
        restored.restore([savepoint])
        assert sorted(k for _, k in restored.keys("v")) == list(range(100, 150))


@pytest.mark.parametrize("kind", BACKENDS)
def test_full_snapshot_cleanup_leaves_expired_values_out(kind: str, make_backend: MakeBackend, clock: Clock) -> None:
    be = make_backend(kind)
    keep = ValueStateDescriptor("keep", serializer="int64", ttl=ttl())
    drop = ValueStateDescriptor("drop", serializer="int64", ttl=ttl(cleanup_full_snapshot=True))
    keys = be.key_batch([pa.array(range(10))])
    for desc in (keep, drop):
        be.batch_state(desc).put(keys, pa.array(range(10), pa.int64()))
    clock.advance(20_000)
    handle = be.snapshot(1, savepoint=True).run()
    rows = {"keep": 0, "drop": 0}
    from sluice.state.canonical import canonical_groups

    for _, table in canonical_groups([handle], be.key_groups, be.transfer):
        for name in table.column("state").to_pylist():
            rows[name] += 1
    assert rows == {"keep": 10, "drop": 0}


def test_rocksdb_refuses_adding_a_ttl_to_checkpointed_state(make_backend: MakeBackend) -> None:
    be = make_backend("rocksdb")
    at(be, 1)
    be.state(ValueStateDescriptor("v", serializer="int64")).update(1)
    restored = make_backend("rocksdb")
    restored.restore([be.snapshot(1).run()])
    with pytest.raises(RestoreError, match="no TTL, now one"):
        restored.state(ValueStateDescriptor("v", serializer="int64", ttl=ttl()))


def test_ttl_config_is_validated_in_one_line() -> None:
    with pytest.raises(ConfigError, match="ttl must be a finite duration > 0") as info:
        StateTtlConfig(ttl=0)
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="update_type"):
        StateTtlConfig(ttl=1, update_type="on_read")  # type: ignore[arg-type]
    assert StateTtlConfig(ttl="1 h").ttl_ms == 3_600_000
