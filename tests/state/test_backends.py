"""Both state backends behind one SPI: per-key value, list and map state, namespaces, batch-wise access,
copy-on-write snapshots and timers."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from sluice.errors import ConfigError
from sluice.state.api import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from sluice.state.keycodec import decode_key, encode_key
from sluice.state.keygroups import hash_columns, key_groups
from sluice.state.spi import KeyedStateBackend, TimeDomain, Timer

from tests.state.conftest import BACKENDS, MakeBackend


def kg_of(key: Any, max_parallelism: int = 16) -> int:
    """The key group ``key_by`` gives ``key`` (the vectorized hash; a tuple: one column per item)."""
    columns = [pa.array([k]) for k in key] if isinstance(key, tuple) else [pa.array([key])]
    return int(key_groups(hash_columns(columns), max_parallelism)[0])


def at(be: KeyedStateBackend, key: Any) -> KeyedStateBackend:
    be.set_current_key(key, kg_of(key, be.max_parallelism))
    return be


@pytest.mark.parametrize("kind", BACKENDS)
def test_value_list_and_map_state_per_key(kind: str, make_backend: MakeBackend) -> None:
    be = make_backend(kind)
    count = be.state(ValueStateDescriptor("count", 0, serializer="int64"))
    seen = be.state(ListStateDescriptor("seen", serializer="string"))
    attrs = be.state(MapStateDescriptor("attrs", serializer="float64", key_serializer="string"))
    for key in ["a", "b", "c"]:
        at(be, key)
        assert count.value() == 0 and seen.get() == [] and attrs.is_empty()
    at(be, "a")
    count.update(5)
    seen.add("x")
    seen.add_all(["y", "z"])
    attrs.put("p", 1.5)
    attrs.put("q", 2.5)
    at(be, "b")
    count.update(7)
    attrs.put("p", -1.0)
    at(be, "a")
    assert count.value() == 5 and seen.get() == ["x", "y", "z"]
    assert attrs.get("p") == 1.5 and attrs.get("missing", 9.0) == 9.0 and attrs.contains("q")
    assert dict(attrs.items()) == {"p": 1.5, "q": 2.5} and sorted(attrs.keys()) == ["p", "q"]
    attrs.remove("p")
    assert dict(attrs.items()) == {"q": 2.5} and sorted(attrs.values()) == [2.5]
    seen.update(["only"])
    assert seen.get() == ["only"]
    count.update(None)
    assert count.value() == 0
    attrs.clear()
    seen.clear()
    assert attrs.is_empty() and seen.get() == []
    at(be, "b")
    assert count.value() == 7 and attrs.get("p") == -1.0
    assert sorted(k for _, k in be.keys("count")) == ["b"]


@pytest.mark.parametrize("kind", BACKENDS)
def test_pickled_values_and_composite_keys(kind: str, make_backend: MakeBackend) -> None:
    be = make_backend(kind)
    value = be.state(ValueStateDescriptor("obj"))  # no serializer: pickled
    for key in [(1, "x"), (1, "y"), (2, "x"), None, 3.5, b"raw", True]:
        at(be, key)
        value.update({"key": key, "n": [1, 2]})
    for key in [(1, "x"), (2, "x"), None, b"raw", True]:
        at(be, key)
        assert value.value() == {"key": key, "n": [1, 2]}
    keys = [k for _, k in be.keys("obj")]
    assert sorted(map(repr, keys)) == sorted(map(repr, [(1, "x"), (1, "y"), (2, "x"), None, 3.5, b"raw", True]))


@pytest.mark.parametrize("kind", BACKENDS)
def test_namespaces_scope_state(kind: str, make_backend: MakeBackend) -> None:
    be = make_backend(kind)
    total = be.state(ValueStateDescriptor("total", 0, serializer="int64"))
    items = be.state(MapStateDescriptor("items", serializer="int64", key_serializer="int64"))
    at(be, 42)
    for window in (b"w1", b"w2"):
        be.set_current_namespace(window)
        total.update(len(window) * (2 if window == b"w2" else 1))
        items.put(1, 10 if window == b"w1" else 20)
    be.set_current_namespace(b"w1")
    assert total.value() == 2 and dict(items.items()) == {1: 10}
    be.set_current_namespace(b"w2")
    assert total.value() == 4 and dict(items.items()) == {1: 20}
    items.clear()
    be.set_current_namespace(b"w1")
    assert dict(items.items()) == {1: 10}
    be.set_current_namespace(b"")
    assert total.value() == 0


@pytest.mark.parametrize("kind", BACKENDS)
def test_batch_access_matches_per_key_access(kind: str, make_backend: MakeBackend) -> None:
    be = make_backend(kind)
    desc = ValueStateDescriptor("count", serializer="int64")
    batch = be.batch_state(desc)
    keys = be.key_batch([pa.array([f"k{i}" for i in range(200)])])
    assert batch.get(keys).null_count == 200
    batch.put(keys, pa.array(range(200), pa.int64()))
    got = batch.get(keys)
    assert got.type == pa.int64() and got.to_pylist() == list(range(200))
    per_key = be.state(desc)
    at(be, "k17")
    assert per_key.value() == 17
    per_key.update(1000)
    assert batch.get(be.key_batch([pa.array(["k17", "nope"])])).to_pylist() == [1000, None]
    batch.put(be.key_batch([pa.array(["k1", "k2"])]), pa.array([None, 5], pa.int64()))  # a null clears
    batch.delete(be.key_batch([pa.array(["k3"])]))
    assert batch.get(be.key_batch([pa.array(["k1", "k2", "k3", "k4"])])).to_pylist() == [None, 5, None, 4]


@pytest.mark.parametrize("kind", BACKENDS)
def test_batch_access_with_several_key_columns_and_struct_values(kind: str, make_backend: MakeBackend) -> None:
    be = make_backend(kind)
    struct = pa.struct([("n", pa.int64()), ("name", pa.string()), ("ok", pa.bool_())])
    batch = be.batch_state(ValueStateDescriptor("row", serializer=struct))
    cols = [pa.array([1, 1, 2]), pa.array(["a", "b", "a"])]
    keys = be.key_batch(cols)
    rows = pa.array([{"n": 1, "name": "x", "ok": True}, {"n": None, "name": "y", "ok": False}, None], struct)
    batch.put(keys, rows)
    assert batch.get(keys).to_pylist() == rows.to_pylist()
    at(be, (1, "b"))
    assert be.state(ValueStateDescriptor("row", serializer=struct)).value() == {"n": None, "name": "y", "ok": False}


@pytest.mark.parametrize("kind", BACKENDS)
def test_batch_access_refuses_what_it_cannot_do(kind: str, make_backend: MakeBackend) -> None:
    be = make_backend(kind, parallelism=2, index=0)
    with pytest.raises(ConfigError, match="batch-wise access needs a value state whose serializer has an Arrow type"):
        be.batch_state(ValueStateDescriptor("p"))
    with pytest.raises(ConfigError, match="batch-wise access needs"):
        be.batch_state(ListStateDescriptor("l", serializer="int64"))
    foreign = [k for k in range(100) if kg_of(k) >= be.key_groups.end][:3]
    with pytest.raises(ConfigError, match="outside KeyGroupRange"):
        be.key_batch([pa.array(foreign)])
    be.state(ValueStateDescriptor("v", serializer="int64"))
    with pytest.raises(ConfigError, match="already used with another kind"):
        be.state(ValueStateDescriptor("v", serializer="string"))


@pytest.mark.parametrize("kind", BACKENDS)
def test_snapshot_sees_state_as_of_its_synchronous_part(kind: str, make_backend: MakeBackend) -> None:
    be = make_backend(kind)
    v = be.state(ValueStateDescriptor("v", serializer="int64"))
    lst = be.state(ListStateDescriptor("l", serializer="int64"))
    m = be.state(MapStateDescriptor("m", serializer="int64", key_serializer="string"))
    for k in range(20):
        at(be, k)
        v.update(k)
        lst.add(k)
        m.put("a", k)
    snap = be.snapshot(1)
    for k in range(20):
        at(be, k)
        v.update(-1)
        lst.add(99)
        m.put("a", -1)
        m.put("b", -1)
    handle = snap.run()
    be2 = make_backend(kind)
    be2.restore([handle])
    for k in range(20):
        at(be2, k)
        assert be2.state(ValueStateDescriptor("v", serializer="int64")).value() == k
        assert be2.state(ListStateDescriptor("l", serializer="int64")).get() == [k]
        assert dict(be2.state(MapStateDescriptor("m", serializer="int64", key_serializer="string")).items()) == {"a": k}
    at(be, 3)
    assert v.value() == -1 and lst.get() == [3, 99]


@pytest.mark.parametrize("kind", BACKENDS)
def test_timers_fire_in_order_deduplicated_and_deletable(kind: str, make_backend: MakeBackend) -> None:
    be = make_backend(kind)
    t = be.timers
    assert t.next_timestamp(TimeDomain.EVENT) is None
    for key, ts in [("a", 30), ("b", 10), ("c", 20), ("a", 30), ("a", 5), ("d", 10)]:
        t.register(TimeDomain.EVENT, ts, kg_of(key), encode_key(key))
    t.register(TimeDomain.PROCESSING, 7, kg_of("a"), encode_key("a"), b"ns")
    t.delete(TimeDomain.EVENT, 5, kg_of("a"), encode_key("a"))
    assert t.next_timestamp(TimeDomain.EVENT) == 10
    assert t.next_timestamp(TimeDomain.PROCESSING) == 7
    due = t.pop_due(TimeDomain.EVENT, 20)
    assert [(x.timestamp, decode_key(x.key)) for x in due] == sorted([(10, "b"), (10, "d"), (20, "c")], key=lambda p: (p[0], kg_of(p[1])))
    assert t.pop_due(TimeDomain.EVENT, 20) == []
    assert t.next_timestamp(TimeDomain.EVENT) == 30
    t.register(TimeDomain.EVENT, 25, kg_of("z"), encode_key("z"))
    assert t.next_timestamp(TimeDomain.EVENT) == 25
    assert [decode_key(x.key) for x in t.pop_due(TimeDomain.EVENT, 100)] == ["z", "a"]
    assert t.pop_due(TimeDomain.PROCESSING, 100) == [Timer(7, kg_of("a"), encode_key("a"), b"ns")]
    assert t.next_timestamp(TimeDomain.EVENT) is None and t.next_timestamp(TimeDomain.PROCESSING) is None


@pytest.mark.parametrize("kind", BACKENDS)
def test_timers_are_in_snapshots(kind: str, make_backend: MakeBackend) -> None:
    be = make_backend(kind)
    for i in range(50):
        be.timers.register(TimeDomain.EVENT, 1000 + i, kg_of(i), encode_key(i))
    be.timers.register(TimeDomain.PROCESSING, -5, kg_of("neg"), encode_key("neg"), b"w")
    handle = be.snapshot(1).run()
    be2 = make_backend(kind)
    be2.restore([handle])
    assert sorted(be2.timers.timers(TimeDomain.EVENT)) == sorted(be.timers.timers(TimeDomain.EVENT))
    assert list(be2.timers.timers(TimeDomain.PROCESSING)) == [Timer(-5, kg_of("neg"), encode_key("neg"), b"w")]
    assert be2.timers.next_timestamp(TimeDomain.EVENT) == 1000


@pytest.mark.parametrize("kind", BACKENDS)
def test_encoded_keys_are_the_stored_bytes_of_the_keys_with_a_value_in_the_default_namespace(
    kind: str, make_backend: MakeBackend
) -> None:
    """The bulk form of ``keys()`` (a restore rebuilds filters from it): per key group the encoded keys,
    each once (a map state has an entry per user key), none that has a value only in another namespace;
    also for state restored but not yet used (the hashmap backend keeps it as rows until then)."""
    be = make_backend(kind)
    keys: list[Any] = [(1, "x"), (1, "y"), None, 3.5, "a" * 300, b"raw", True, 7, -(2**40)]
    value = be.state(ValueStateDescriptor("v", serializer="int64"))
    attrs = be.state(MapStateDescriptor("m", serializer="int64", key_serializer="int64"))
    for i, key in enumerate(keys):
        at(be, key)
        value.update(i)
        for uk in range(3):
            attrs.put(uk, uk)
    at(be, "only-in-a-window")
    be.set_current_namespace(b"w")
    value.update(1)
    attrs.put(1, 1)
    be.set_current_namespace(b"")

    def encoded(backend: KeyedStateBackend, name: str) -> list[tuple[int, bytes]]:
        out = [(kg, k) for kg, arr in backend.encoded_keys(name) for k in arr.to_pylist()]
        assert len(out) == len(set(out)), out
        return sorted(out)

    expected = sorted((kg_of(k), encode_key(k)) for k in keys)
    for name in ("v", "m"):
        assert encoded(be, name) == expected
        default = [(kg, k) for kg, arr in KeyedStateBackend.encoded_keys(be, name) for k in arr.to_pylist()]
        assert sorted(default) == expected  # the SPI's default, from keys()
    restored = make_backend(kind)
    restored.restore([be.snapshot(1).run()])
    assert encoded(restored, "v") == encoded(restored, "m") == expected
