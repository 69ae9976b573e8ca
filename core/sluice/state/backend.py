"""In-memory keyed state with copy-on-write snapshots.

State lives in one table per (state name, key group). A snapshot only *freezes* the tables it sees
(O(key groups), no copying): the first write to a frozen table afterwards copies that table's dict, and
the first in-place change of a list or map value copies that value. The frozen tables are what the
asynchronous part of the checkpoint serializes while the task keeps processing.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sluice.state.api import (
    ListState,
    ListStateDescriptor,
    MapState,
    MapStateDescriptor,
    StateDescriptor,
    ValueState,
)
from sluice.state.keygroups import KeyGroupRange

__all__ = ["InMemoryStateBackend", "KeyedStateSnapshot"]


class _Table:
    """One key group's entries of one state, with copy-on-write bookkeeping."""

    __slots__ = ("data", "owned", "shared")

    def __init__(self, data: dict[Any, Any] | None = None) -> None:
        self.data: dict[Any, Any] = data if data is not None else {}
        self.shared = False  # a snapshot holds self.data: copy before writing
        self.owned: set[Any] | None = None  # keys whose container values were copied since the last freeze

    def writable(self) -> dict[Any, Any]:
        if self.shared:
            self.data = dict(self.data)
            self.shared = False
            self.owned = set()
        return self.data


class KeyedStateSnapshot:
    """A frozen view of keyed state: ``{key_group: {state_name: {key: value}}}``, serialized lazily."""

    def __init__(self, groups: dict[int, dict[str, dict[Any, Any]]]) -> None:
        self._groups = groups

    def serialize(self) -> dict[int, bytes]:
        """Pickle each key group (the asynchronous part of a checkpoint)."""
        return {kg: pickle.dumps(states, protocol=5) for kg, states in self._groups.items() if states}


class InMemoryStateBackend:
    """Keyed state of one operator subtask, for the key groups it owns.

    Operators set the current key (and its key group) before user code touches state handles.
    """

    def __init__(self, key_groups: KeyGroupRange) -> None:
        self.key_groups = key_groups
        self._tables: dict[int, dict[str, _Table]] = {kg: {} for kg in key_groups}
        self._key: Any = None
        self._kg: int = -1
        self._handles: dict[str, Any] = {}

    # -- current key ---------------------------------------------------------------------------------
    def set_current_key(self, key: Any, key_group: int) -> None:
        self._key = key
        self._kg = key_group

    @property
    def current_key(self) -> Any:
        return self._key

    # -- access used by state handles ------------------------------------------------------------------
    def _table(self, name: str) -> _Table:
        tables = self._tables[self._kg]
        t = tables.get(name)
        if t is None:
            t = tables[name] = _Table()
        return t

    def get(self, name: str) -> Any:
        t = self._tables[self._kg].get(name)
        return None if t is None else t.data.get(self._key)

    def put(self, name: str, value: Any) -> None:
        t = self._table(name)
        t.writable()[self._key] = value
        if t.owned is not None:
            t.owned.add(self._key)

    def delete(self, name: str) -> None:
        t = self._tables[self._kg].get(name)
        if t is not None and self._key in t.data:
            del t.writable()[self._key]

    def mutable(self, name: str, factory: Callable[[], Any]) -> Any:
        t = self._table(name)
        data = t.writable()
        key = self._key
        value = data.get(key)
        if value is None:
            value = data[key] = factory()
            if t.owned is not None:
                t.owned.add(key)
        elif t.owned is not None and key not in t.owned:
            value = data[key] = copy.copy(value)
            t.owned.add(key)
        return value

    # -- handles -------------------------------------------------------------------------------------
    def state(self, desc: StateDescriptor) -> Any:
        """The handle for ``desc`` (value, list or map state), bound to the current key."""
        h = self._handles.get(desc.name)
        if h is None:
            if isinstance(desc, ListStateDescriptor):
                h = ListState(self, desc)
            elif isinstance(desc, MapStateDescriptor):
                h = MapState(self, desc)
            else:
                h = ValueState(self, desc)
            self._handles[desc.name] = h
        return h

    def keys(self, name: str) -> Iterable[tuple[int, Any]]:
        """Every (key group, key) that has a value in state ``name``."""
        for kg, tables in self._tables.items():
            t = tables.get(name)
            if t is not None:
                for k in list(t.data):
                    yield kg, k

    # -- checkpoints ---------------------------------------------------------------------------------
    def snapshot(self) -> KeyedStateSnapshot:
        """Freeze the current state (cheap, synchronous) and return it for asynchronous serialization."""
        groups: dict[int, dict[str, dict[Any, Any]]] = {}
        for kg, tables in self._tables.items():
            frozen = {}
            for name, t in tables.items():
                if t.data:
                    t.shared = True
                    t.owned = None
                    frozen[name] = t.data
            if frozen:
                groups[kg] = frozen
        return KeyedStateSnapshot(groups)

    def restore(self, groups: Mapping[int, bytes]) -> None:
        """Load the key groups this subtask owns out of serialized snapshots (others are ignored)."""
        for kg, blob in groups.items():
            if kg in self.key_groups:
                states: dict[str, dict[Any, Any]] = pickle.loads(blob)
                self._tables[kg] = {name: _Table(data) for name, data in states.items()}
