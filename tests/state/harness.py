"""Helpers for checkpoint tests of keyed backends: a reference model of the state, random operations applied
to both, and what the coordinator's completed-checkpoint store does with keyed state handles."""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from sluice.errors import CheckpointError
from sluice.state.api import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from sluice.state.handles import handle_files
from sluice.state.keycodec import decode_key, encode_key
from sluice.state.shared_registry import SharedStateRegistry, shared_refs
from sluice.state.spi import Handle, KeyedStateBackend, TimeDomain
from sluice.state.transfer import FileTransfer

from tests.state.test_backends import at, kg_of

VALUE = ValueStateDescriptor("v", serializer="int64")
LIST = ListStateDescriptor("l", serializer="string")
MAP = MapStateDescriptor("m", serializer="int64", key_serializer="string")
COUNT = ValueStateDescriptor("c", serializer="int64")  # written batch-wise
KEYS = range(48)


@dataclass
class Model:
    """What the state should be: per key, a value, a list, a map, a count, and event timers."""

    values: dict[int, int] = field(default_factory=dict)
    lists: dict[int, list[str]] = field(default_factory=dict)
    maps: dict[int, dict[str, int]] = field(default_factory=dict)
    counts: dict[int, int] = field(default_factory=dict)
    timers: set[tuple[int, int]] = field(default_factory=set)

    def copy(self) -> Model:
        return copy.deepcopy(self)

    def owned(self, be: KeyedStateBackend) -> Model:
        """Only the keys ``be`` owns."""
        mine = {k for k in KEYS if kg_of(k, be.max_parallelism) in be.key_groups}
        return Model(
            {k: v for k, v in self.values.items() if k in mine},
            {k: v for k, v in self.lists.items() if k in mine},
            {k: v for k, v in self.maps.items() if k in mine},
            {k: v for k, v in self.counts.items() if k in mine},
            {t for t in self.timers if t[1] in mine},
        )

    def merge(self, other: Model) -> Model:
        return Model(
            {**self.values, **other.values}, {**self.lists, **other.lists}, {**self.maps, **other.maps},
            {**self.counts, **other.counts}, self.timers | other.timers,
        )  # fmt: skip


def random_op(be: KeyedStateBackend, model: Model, rng: random.Random) -> None:
    """One random change of a key ``be`` owns, applied to the backend and the model."""
    keys = [k for k in KEYS if kg_of(k, be.max_parallelism) in be.key_groups]
    k = rng.choice(keys)
    at(be, k)
    op = rng.randrange(12)
    if op == 0:
        be.state(VALUE).update(v := rng.randrange(1000))
        model.values[k] = v
    elif op == 1:
        be.state(VALUE).clear()
        model.values.pop(k, None)
    elif op in (2, 3):
        be.state(LIST).add(s := f"e{rng.randrange(100)}")
        model.lists.setdefault(k, []).append(s)
    elif op == 4:
        items = [f"u{rng.randrange(100)}" for _ in range(rng.randrange(3))]
        be.state(LIST).update(items)
        if items:
            model.lists[k] = items
        else:
            model.lists.pop(k, None)
    elif op in (5, 6):
        be.state(MAP).put(mk := f"m{rng.randrange(5)}", v := rng.randrange(1000))
        model.maps.setdefault(k, {})[mk] = v
    elif op == 7:
        be.state(MAP).remove(mk := f"m{rng.randrange(5)}")
        if mk in model.maps.get(k, {}):
            del model.maps[k][mk]
            if not model.maps[k]:
                del model.maps[k]
    elif op == 8:
        ks = rng.sample(keys, min(len(keys), 5))
        vals = [rng.choice([None, rng.randrange(1000)]) for _ in ks]
        be.batch_state(COUNT).put(be.key_batch([pa.array(ks, pa.int64())]), pa.array(vals, pa.int64()))
        for key, v in zip(ks, vals, strict=True):
            if v is None:
                model.counts.pop(key, None)
            else:
                model.counts[key] = v
    elif op == 9:
        ts = rng.randrange(100)
        be.timers.register(TimeDomain.EVENT, ts, kg_of(k, be.max_parallelism), encode_key(k))
        model.timers.add((ts, k))
    elif op == 10:
        ts = rng.randrange(100)
        be.timers.delete(TimeDomain.EVENT, ts, kg_of(k, be.max_parallelism), encode_key(k))
        model.timers.discard((ts, k))
    else:
        upto = rng.randrange(20)
        fired = {(t.timestamp, decode_key(t.key)) for t in be.timers.pop_due(TimeDomain.EVENT, upto)}
        due = {t for t in model.timers if t[0] <= upto}
        assert fired == due
        model.timers -= due


def dump(be: KeyedStateBackend) -> Model:
    """Everything ``be`` holds, read through its handles."""
    out = Model()
    for _, k in list(be.keys("v")):
        out.values[k] = at(be, k).state(VALUE).value()
    for _, k in list(be.keys("l")):
        out.lists[k] = at(be, k).state(LIST).get()
    for _, k in list(be.keys("m")):
        out.maps[k] = dict(at(be, k).state(MAP).items())
    counted = sorted(k for _, k in be.keys("c"))
    if counted:
        got = be.batch_state(COUNT).get(be.key_batch([pa.array(counted, pa.int64())])).to_pylist()
        out.counts = dict(zip(counted, got, strict=True))
    out.timers = {(t.timestamp, decode_key(t.key)) for t in be.timers.timers(TimeDomain.EVENT)}
    return out


class Coordinator:
    """What the completed-checkpoint store does with keyed state handles: registers their shared files,
    keeps ``retained`` checkpoints, and deletes files no retained checkpoint references (shared files
    through the registry, private ones with their checkpoint), and an aborted checkpoint's own uploads."""

    def __init__(self, storage: FileTransfer, retained: int = 2) -> None:
        self.storage = storage
        self.registry = SharedStateRegistry()
        self.keep = retained
        self.retained: list[tuple[int, list[Handle]]] = []
        self.deleted: list[str] = []
        self.declined = 0

    def _delete(self, paths: Any) -> None:
        for p in paths:
            self.storage.delete(p)
            self.deleted.append(p)

    @staticmethod
    def _private(handles: list[Handle]) -> list[str]:
        return [ref.path for h in handles for ref, _ in handle_files(h) if not ref.path.startswith("shared/")]

    def complete(self, checkpoint_id: int, handles: list[Handle]) -> bool:
        """The checkpoint completes (True), or is declined by the registry (False, and aborted)."""
        try:
            self.registry.register_checkpoint(checkpoint_id, shared_refs(handles))
        except CheckpointError:
            self.declined += 1
            self.abort(handles)
            return False
        self.retained.append((checkpoint_id, handles))
        while len(self.retained) > self.keep:
            _, old = self.retained.pop(0)
            self._delete(self._private(old))
        self._delete(self.registry.unregister_unused(self.retained[0][0]))
        return True

    def abort(self, handles: list[Handle]) -> None:
        self._delete(self.registry.discard_unregistered(shared_refs(handles)))
        self._delete(self._private(handles))

    def referenced(self) -> set[str]:
        """Every file a retained checkpoint references."""
        return {ref.path for _, hs in self.retained for h in hs for ref, _ in handle_files(h)}
