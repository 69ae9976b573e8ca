"""The hashmap backend's bulk snapshot path writes the same checkpoint bytes as the per-entry path."""

from __future__ import annotations

import datetime
import random
from pathlib import Path
from typing import Any

import pytest
from sluice.state.api import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from sluice.state.canonical import read_group
from sluice.state.config import StateTtlConfig
from sluice.state.hashmap import backend as hashmap_backend
from sluice.state.hashmap.backend import HashMapKeyedStateBackend, HashMapStateBackend
from sluice.state.keygroups import KeyGroupRange
from sluice.state.spi import Handle, TimeDomain
from sluice.state.transfer import LocalFileTransfer

from tests.state.test_backends import kg_of

TTL = StateTtlConfig(ttl=60)
DESCRIPTORS: list[Any] = [
    ValueStateDescriptor("v-int", serializer="int64"),
    ValueStateDescriptor("v-float", serializer="float64"),
    ValueStateDescriptor("v-bool", serializer="bool"),
    ValueStateDescriptor("v-str", serializer="string"),
    ValueStateDescriptor("v-bin", serializer="binary"),
    ValueStateDescriptor("v-ts", serializer="timestamp[us]"),
    ValueStateDescriptor("v-pickle"),
    ValueStateDescriptor("v-ttl", serializer="int64", ttl=TTL),
    ListStateDescriptor("l-str", serializer="string"),
    ListStateDescriptor("l-ttl", serializer="int64", ttl=TTL),
    MapStateDescriptor("m-int", serializer="int64", key_serializer="string"),
    MapStateDescriptor("m-ttl", serializer="string", key_serializer="int64", ttl=TTL),
]
NAMESPACES = [b"", b"", b"w", b"window-0001", bytes(300)]


def _key(rng: random.Random) -> Any:
    kind = rng.randrange(6)
    if kind == 0:
        return rng.randrange(-(2**40), 2**40)
    if kind == 1:
        return f"k{rng.randrange(10**6)}" * rng.randrange(1, 4)
    if kind == 2:
        return (rng.randrange(100), f"t{rng.randrange(100)}")
    if kind == 3:
        return rng.random() * 1000
    if kind == 4:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(5)))
    return datetime.datetime(2026, 1, 1) + datetime.timedelta(seconds=rng.randrange(10**6))


def _value(desc: Any, rng: random.Random) -> Any:
    ser = desc.serializer
    if ser == "float64":
        return rng.random()
    if ser == "bool":
        return rng.random() < 0.5
    if ser == "string":
        return f"s{rng.randrange(10**4)}" * rng.randrange(3)
    if ser == "binary":
        return bytes(rng.randrange(256) for _ in range(rng.randrange(6)))
    if ser == "timestamp[us]":
        return datetime.datetime(2026, 1, 1) + datetime.timedelta(microseconds=rng.randrange(10**12))
    if ser is None:
        return {"a": rng.randrange(10), "b": [rng.random()]}
    return rng.randrange(-(2**62), 2**62)


def _fill(be: HashMapKeyedStateBackend, rng: random.Random, entries: int, mp: int) -> None:
    for _ in range(entries):
        key = _key(rng)
        be.set_current_key(key, kg_of(key, mp))
        be.set_current_namespace(rng.choice(NAMESPACES))
        desc = rng.choice(DESCRIPTORS)
        state = be.state(desc)
        if isinstance(desc, ValueStateDescriptor):
            state.update(_value(desc, rng))
        elif isinstance(desc, ListStateDescriptor):
            state.update([_value(desc, rng) for _ in range(rng.randrange(4))])
        else:
            key_desc = ValueStateDescriptor("k", serializer=desc.key_serializer)
            for _ in range(rng.randrange(4)):
                state.put(_value(key_desc, rng), _value(desc, rng))
        if rng.random() < 0.1:
            be.timers.register(TimeDomain.EVENT, rng.randrange(10**6), be.current_key_group, be._key_bytes, b"")


def _snapshots(be: HashMapKeyedStateBackend, monkeypatch: pytest.MonkeyPatch) -> tuple[Handle, Handle]:
    bulk = be.snapshot(1).run()
    with monkeypatch.context() as m:
        m.setattr(hashmap_backend, "bulk_rows", lambda reg, data: None)  # the per-entry path only
        per_entry = be.snapshot(2).run()
    return bulk, per_entry


@pytest.mark.parametrize("seed", range(4))
def test_bulk_snapshot_writes_the_per_entry_bytes(seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    mp = 8
    clock = [1_000_000]
    be = HashMapStateBackend().create_keyed_backend(
        "op", KeyGroupRange(0, mp), mp, LocalFileTransfer(str(tmp_path)), clock=lambda: clock[0]
    )
    _fill(be, rng, 3000, mp)
    bulk, per_entry = _snapshots(be, monkeypatch)
    assert bulk["groups"].keys() == per_entry["groups"].keys()
    for kg, data in per_entry["groups"].items():
        assert read_group(bulk["groups"][kg]).equals(read_group(data)), kg
        assert bulk["groups"][kg] == data, kg
    assert bulk == per_entry


def test_bulk_rows_cross_batches_as_rows_added_one_by_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A key group of more than one Arrow batch (65536 rows) mixing bulk rows, per-entry rows and timers."""
    be = HashMapStateBackend().create_keyed_backend("op", KeyGroupRange(0, 1), 1, LocalFileTransfer(str(tmp_path)))
    for i in range(70_000):
        be.set_current_key(i, 0)
        be.set_current_namespace(b"" if i % 3 else b"ns")
        if i % 7 == 0:
            be.state(ValueStateDescriptor("a", serializer="int64", ttl=TTL)).update(i)
        be.state(ValueStateDescriptor("b", serializer="int64")).update(i)
        if i % 5 == 0:
            be.state(ListStateDescriptor("c", serializer="string")).add(str(i))
            be.timers.register(TimeDomain.PROCESSING, i, 0, be._key_bytes, b"")
    bulk, per_entry = _snapshots(be, monkeypatch)
    assert read_group(bulk["groups"][0]).num_rows == 10_000 + 70_000 + 2 * 14_000
    assert bulk == per_entry


def test_a_float_in_an_integer_state_is_never_truncated_by_the_bulk_path() -> None:
    """pyarrow converts 1.5 into an int64 column as 1; the bulk encoding must leave such values to the
    per-entry path, which refuses them (as snapshots did before the bulk path) instead of truncating."""
    from sluice.state.hashmap.bulk import encode_values
    from sluice.state.serializers import serializer_for

    ints = serializer_for("int64")
    assert encode_values(ints, [1, 2, True]).to_pylist() == [ints.encode(1), ints.encode(2), ints.encode(True)]
    with pytest.raises(Exception, match=r"required argument is not an integer|cannot encode"):
        encode_values(ints, [1, 1.5])
