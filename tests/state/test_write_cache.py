"""The RocksDB backend's write-back cache changes nothing anyone can see: random operations (batch-wise and
per key, timers, TTL, cleanup, checkpoints taken while writes go on, restores) give the same results with
the cache on (a budget small enough to evict all the time), with it off, and on the hashmap backend."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from sluice.state.api import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from sluice.state.config import StateTtlConfig
from sluice.state.keycodec import encode_key
from sluice.state.keygroups import key_group_range
from sluice.state.spi import KeyedStateBackend, TimeDomain
from sluice.state.transfer import LocalFileTransfer

from tests.state.conftest import Clock, MakeBackend, state_backend
from tests.state.test_backends import at, kg_of

COUNT = ValueStateDescriptor("count", serializer="int64")  # int keys: fixed-width storage keys
NAME = ValueStateDescriptor("name", serializer="string")  # string keys: variable width
SEEN = ValueStateDescriptor("seen", serializer="float64", ttl=StateTtlConfig(ttl="10 s", update_type="on_read_and_write"))
OBJ = ValueStateDescriptor("obj")  # pickled
LIST = ListStateDescriptor("list", serializer="string")
MAP = MapStateDescriptor("map", serializer="float64", key_serializer="int64")
KEYS = 3000
#: the three set-ups compared: a tiny write-back cache (about 2000 entries: evicts all the time), none, hashmap
SETUPS: list[tuple[str, dict[str, Any]]] = [
    ("rocksdb", {"memory": "16 mb", "write_cache_ratio": 0.02}),
    ("rocksdb", {"memory": "16 mb", "write_cache_ratio": 0.0}),
    ("hashmap", {}),
]


def diff(a: Any, b: Any) -> str:
    """Where two results differ, in a few words."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=repr):
            if a.get(k, "<none>") != b.get(k, "<none>"):
                return f"[{k!r}] " + diff(a.get(k, "<none>"), b.get(k, "<none>"))
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                return f"[{i}] " + diff(x, y)
    return f"{a!r:.300} != {b!r:.300}"


class Run:
    """The same random operations on every set-up; each step's visible results compared."""

    def __init__(self, tmp_path: Path, clock: Clock, seed: int) -> None:
        self.tmp = tmp_path
        self.clock = clock
        self.rng = random.Random(seed)
        self.made: list[KeyedStateBackend] = []
        self.backends = self.make()
        self.cid = 0

    def make(self) -> list[KeyedStateBackend]:
        """A keyed backend per set-up, each with its own checkpoint storage."""
        out = []
        for i, (kind, options) in enumerate(SETUPS):
            factory = state_backend(kind, self.tmp, **options)
            storage = LocalFileTransfer(str(self.tmp / f"storage-{i}"))
            out.append(factory.create_keyed_backend("op-0", key_group_range(16, 1, 0), 16, storage, self.clock))
        self.made.extend(out)
        return out

    def dispose(self) -> None:
        for be in self.made:
            be.dispose()

    def same(self, results: list[Any], what: str) -> Any:
        for i, r in enumerate(results[1:], 1):
            assert r == results[0], f"{what}: set-up {i} differs from set-up 0: {diff(results[0], r)}"
        return results[0]

    def int_keys(self) -> list[int]:
        return [self.rng.randrange(KEYS) for _ in range(self.rng.randint(1, 300))]

    # -- operations -----------------------------------------------------------------------------------
    def batch(self) -> None:
        rng = self.rng
        desc, kind = rng.choice([(COUNT, None), (NAME, "str"), (SEEN, None)])
        ints = self.int_keys()
        keys = [f"k{i}" for i in ints] if kind == "str" else ints
        op = rng.choice(["put", "put", "get", "delete"])
        if desc is NAME:
            values = pa.array([None if rng.random() < 0.1 else f"v{rng.randrange(100)}" for _ in keys], pa.string())
        elif desc is SEEN:
            values = pa.array([None if rng.random() < 0.1 else rng.random() for _ in keys], pa.float64())
        else:
            values = pa.array([None if rng.random() < 0.1 else rng.randrange(-(2**40), 2**40) for _ in keys], pa.int64())
        out = []
        for be in self.backends:
            state, batch = be.batch_state(desc), be.key_batch([pa.array(keys)])
            if op == "put":
                state.put(batch, values)
            elif op == "delete":
                state.delete(batch)
            got = state.get(batch).to_pylist()
            out.append(got)
        self.same(out, f"batch {op} {desc.name}")

    def per_key(self) -> None:
        rng = self.rng
        key = rng.randrange(KEYS)
        ns = rng.choice([b"", b"", b"w1"])
        op = rng.choice(["value", "update", "clear", "add", "list", "put", "get", "remove", "items"])
        arg = rng.randrange(1000)
        out = []
        for be in self.backends:
            at(be, key).set_current_namespace(ns)
            v, lst, m = be.state(OBJ), be.state(LIST), be.state(MAP)
            if op == "update":
                v.update({"n": arg, "t": (arg, str(arg))})
            elif op == "clear":
                v.clear()
            elif op == "add":
                lst.add(str(arg))
            elif op == "put":
                m.put(arg % 7, arg / 3)
            elif op == "remove":
                m.remove(arg % 7)
            out.append((v.value(), lst.get(), m.get(arg % 7), m.contains(arg % 7), sorted(m.items())))
            be.set_current_namespace(b"")
        self.same(out, f"per key {op}")

    def timers(self) -> None:
        rng = self.rng
        domain = rng.choice(list(TimeDomain))
        op = rng.choice(["register", "register", "delete", "pop", "next"])
        key, ts, upto = rng.randrange(200), rng.randrange(10_000), rng.randrange(10_000)
        out = []
        for be in self.backends:
            t, popped = be.timers, None
            if op == "register":
                t.register(domain, ts, kg_of(key), encode_key(key), b"n" if key % 3 == 0 else b"")
            elif op == "delete":
                t.delete(domain, ts, kg_of(key), encode_key(key))
            elif op == "pop":
                popped = t.pop_due(domain, upto)
            out.append((popped, t.next_timestamp(domain)))
        self.same(out, f"timers {op}")

    def dump(self, be: KeyedStateBackend) -> dict[str, Any]:
        """Every state's content (reads refresh SEEN's TTL the same way on each set-up)."""
        out: dict[str, Any] = {}
        for desc in (COUNT, SEEN):
            keys = sorted(k for _, k in be.keys(desc.name))  # with expired values not cleaned up yet
            values = be.batch_state(desc).get(be.key_batch([pa.array(keys, pa.int64())])).to_pylist() if keys else []
            out[desc.name] = {k: v for k, v in zip(keys, values, strict=True) if v is not None}
        names = sorted(k for _, k in be.keys(NAME.name))
        out[NAME.name] = be.batch_state(NAME).get(be.key_batch([pa.array(names, pa.string())])).to_pylist() if names else []
        per_key = {}
        for key in sorted({k for name in ("obj", "list", "map") for _, k in be.keys(name)}):
            at(be, key)
            per_key[key] = (be.state(OBJ).value(), be.state(LIST).get(), sorted(be.state(MAP).items()))
        out["per_key"] = per_key
        out["timers"] = [sorted(be.timers.timers(d)) for d in TimeDomain]
        return out

    def checkpoint(self) -> None:
        """A checkpoint while writes go on: its handle restores exactly the state of its synchronous part;
        sometimes the run goes on with the restored backends."""
        self.cid += 1
        before = self.same([self.dump(be) for be in self.backends], "dump")
        snaps = [be.snapshot(self.cid, savepoint=self.rng.random() < 0.3) for be in self.backends]
        for _ in range(self.rng.randint(0, 20)):
            self.step(advance=False)
        handles = [s.run() for s in snaps]
        for be in self.backends:
            be.notify_checkpoint_complete(self.cid)
        restored = self.make()
        for be, h in zip(restored, handles, strict=True):
            be.restore([h])
        assert [self.dump(be) for be in restored] == [before] * len(restored)
        if self.rng.random() < 0.5:
            self.backends = restored

    def step(self, advance: bool = True) -> None:
        r = self.rng.random()
        if r < 0.45:
            self.batch()
        elif r < 0.75:
            self.per_key()
        elif r < 0.9:
            self.timers()
        elif r < 0.95 and advance:
            self.clock.advance(self.rng.randrange(4000))
        else:
            most = self.rng.randint(1, 400)
            removed = [be.cleanup_expired(most) for be in self.backends[:2]]
            self.same(removed, "cleanup_expired")  # the two RocksDB set-ups (hashmap cleans up as it goes)

    def go(self, steps: int) -> None:
        for i in range(steps):
            self.step()
            if i % 150 == 149:
                self.checkpoint()
        self.checkpoint()


@pytest.mark.parametrize("seed", [1, 2])
def test_the_write_cache_changes_nothing_visible(tmp_path: Path, clock: Clock, seed: int) -> None:
    run = Run(tmp_path, clock, seed)
    cached: Any = run.backends[0]
    uncached: Any = run.backends[1]
    assert cached.cache.enabled and not uncached.cache.enabled
    try:
        run.go(450)
    finally:
        run.dispose()


@pytest.mark.soak
@pytest.mark.parametrize("seed", range(10, 30))
def test_the_write_cache_changes_nothing_visible_soak(tmp_path: Path, clock: Clock, seed: int) -> None:
    run = Run(tmp_path, clock, seed)
    try:
        run.go(3000)
    finally:
        run.dispose()


def test_the_cache_writes_back_at_snapshots_and_scans_and_evicts_within_its_budget(make_backend: MakeBackend) -> None:
    be: Any = make_backend("rocksdb", memory="16 mb", write_cache_ratio=0.05)
    budget = be.resources.write_cache_share()
    state = be.batch_state(COUNT)
    keys = be.key_batch([pa.array(range(1000))])
    state.put(keys, pa.array(range(1000), pa.int64()))
    stored = state._keys(keys)[0][5]  # the storage key of key 5
    assert be.cache.dirty == 1000 and be.db.get(stored) is None  # written to the cache only
    be.snapshot(1).discard()  # the synchronous part writes back before the native checkpoint
    assert be.cache.dirty == 0 and be.db.get(stored) == (5).to_bytes(8, "big")
    state.put(keys, pa.array([7] * 1000, pa.int64()))
    assert sorted(k for _, k in be.keys("count")) == list(range(1000))  # a scan writes back first
    assert be.cache.dirty == 0
    for start in range(0, 60_000, 5000):  # far more than the cache holds
        state.put(be.key_batch([pa.array(range(start, start + 5000))]), pa.array([start] * 5000, pa.int64()))
        assert be.cache.measure() <= budget
    assert state.get(be.key_batch([pa.array([0, 999, 1000, 59_999])])).to_pylist() == [0, 0, 0, 55_000]
