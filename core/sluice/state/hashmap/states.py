"""The hashmap backend's state handles: per key (value, list, map) and batch-wise (value).

Values are kept as Python objects; a state with a TTL keeps ``(value, expiry)`` (per list element, per
map entry).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import repeat
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from sluice.state.keycodec import rows_as_bytes
from sluice.state.meta import RegisteredState
from sluice.state.spi import BatchValueState, KeyBatch

if TYPE_CHECKING:
    from sluice.state.hashmap.backend import HashMapKeyedStateBackend
    from sluice.state.hashmap.tables import Table

__all__ = ["HeapBatchValueState", "HeapListState", "HeapMapState", "HeapValueState"]


class _Handle:
    def __init__(self, backend: HashMapKeyedStateBackend, reg: RegisteredState) -> None:
        self._be = backend
        self._reg = reg
        self.descriptor: Any = None  # the descriptor the handle was made for
        self._tables = backend.tables_of(reg.name)
        self._tick = reg.ttl is not None and reg.ttl.cleanup_in_background

    def _table(self) -> Table | None:
        if self._tick:
            self._be.background_cleanup(self._reg)
        return self._tables.get(self._be.current_key_group)

    def _own_table(self) -> Table:
        from sluice.state.hashmap.tables import Table

        kg = self._be.current_key_group
        t = self._tables.get(kg)
        if t is None:
            t = self._tables[kg] = Table()
        return t

    def clear(self) -> None:
        """Clear the current key's value."""
        t = self._table()
        if t is not None:
            t.delete(self._be.entry_key())


class HeapValueState(_Handle):
    """One value for the current key."""

    def value(self) -> Any:
        """The value for the current key, or the descriptor's default."""
        t = self._table()
        if t is None:
            return self._reg.default
        ek = self._be.entry_key()
        v = t.data.get(ek)
        if v is None:
            return self._reg.default
        if self._reg.ttl is None:
            return v
        value, expiry = v
        now = self._be.clock()
        if expiry <= now:
            if not self._reg.visible(expiry, now):
                t.delete(ek)
                return self._reg.default
        elif self._reg.refresh_on_read:
            t.put(ek, (value, self._reg.expiry(now)))
        return value

    def update(self, value: Any) -> None:
        """Replace the value for the current key (``None`` clears it)."""
        if value is None:
            self.clear()
            return
        v = value if self._reg.ttl is None else (value, self._reg.expiry(self._be.clock()))
        self._own_table().put(self._be.entry_key(), v)


class HeapListState(_Handle):
    """A list for the current key."""

    def get(self) -> list[Any]:
        """A copy of the list (empty if none)."""
        t = self._table()
        if t is None:
            return []
        ek = self._be.entry_key()
        items = t.data.get(ek)
        if not items:
            return []
        if self._reg.ttl is None:
            return list(items)
        now = self._be.clock()
        live = [(v, e) for v, e in items if e > now]
        if len(live) < len(items) and self._reg.ttl.visibility == "never_return_expired":
            if live:
                t.put(ek, live)
            else:
                t.delete(ek)
            items = live
        if self._reg.refresh_on_read and items:
            t.put(ek, [(v, self._reg.expiry(now)) for v, _ in items])
        return [v for v, _ in items]

    def add(self, value: Any) -> None:
        """Append ``value``."""
        self.add_all([value])

    def add_all(self, values: Iterable[Any]) -> None:
        """Append every value."""
        vals = list(values)
        if not vals:
            return
        if self._reg.ttl is not None:
            expiry = self._reg.expiry(self._be.clock())
            vals = [(v, expiry) for v in vals]
        self._own_table().mutable(self._be.entry_key(), list).extend(vals)

    def update(self, values: Iterable[Any]) -> None:
        """Replace the list (an empty one clears it)."""
        vals = list(values)
        if not vals:
            self.clear()
            return
        if self._reg.ttl is not None:
            expiry = self._reg.expiry(self._be.clock())
            vals = [(v, expiry) for v in vals]
        self._own_table().put(self._be.entry_key(), vals)


class HeapMapState(_Handle):
    """A map for the current key."""

    def _read(self) -> dict[Any, Any]:
        t = self._table()
        if t is None:
            return {}
        ek = self._be.entry_key()
        m: dict[Any, Any] = t.data.get(ek) or {}
        if self._reg.ttl is None or not m:
            return m
        now = self._be.clock()
        expired = [k for k, (_, e) in m.items() if e <= now]
        if expired and self._reg.ttl.visibility == "never_return_expired":
            own = t.mutable(ek, dict)
            for k in expired:
                del own[k]
            if not own:
                t.delete(ek)
            m = own
        if self._reg.refresh_on_read and m:
            m = {k: (v, self._reg.expiry(now)) for k, (v, _) in m.items()}
            t.put(ek, m)
        return {k: v for k, (v, _) in m.items()}

    def get(self, key: Any, default: Any = None) -> Any:
        """The value of ``key``, or ``default``."""
        return self._read().get(key, default)

    def put(self, key: Any, value: Any) -> None:
        """Set ``key`` to ``value``."""
        v = value if self._reg.ttl is None else (value, self._reg.expiry(self._be.clock()))
        self._own_table().mutable(self._be.entry_key(), dict)[key] = v

    def put_all(self, entries: dict[Any, Any]) -> None:
        """Set every entry."""
        for k, v in entries.items():
            self.put(k, v)

    def remove(self, key: Any) -> None:
        """Remove ``key`` if present."""
        t = self._table()
        if t is None:
            return
        ek = self._be.entry_key()
        if key in (t.data.get(ek) or {}):
            own = t.mutable(ek, dict)
            own.pop(key, None)
            if not own:
                t.delete(ek)

    def contains(self, key: Any) -> bool:
        """Whether ``key`` has a value."""
        return key in self._read()

    def items(self) -> Iterator[tuple[Any, Any]]:
        """The entries (a copy)."""
        return iter(list(self._read().items()))

    def keys(self) -> Iterator[Any]:
        """The keys (a copy)."""
        return iter(list(self._read()))

    def values(self) -> Iterator[Any]:
        """The values (a copy)."""
        return iter(list(self._read().values()))

    def is_empty(self) -> bool:
        """Whether the map has no entry."""
        return not self._read()


class HeapBatchValueState(BatchValueState):
    """Batch-wise access to a value state of the hashmap backend: the batch grouped by key group, one bulk
    dict operation per group (per key where a TTL or a null needs it)."""

    def __init__(self, backend: HashMapKeyedStateBackend, reg: RegisteredState) -> None:
        self._be = backend
        self._reg = reg
        self._tables = backend.tables_of(reg.name)
        self._tick = reg.ttl is not None and reg.ttl.cleanup_in_background
        self._last: tuple[KeyBatch, _Groups] | None = None  # the last batch, grouped

    def _cleanup(self, keys: KeyBatch) -> None:
        if self._tick:
            self._be.background_cleanup(self._reg, len(keys))

    def _grouped(self, keys: KeyBatch) -> _Groups:
        last = self._last
        if last is not None and last[0] is keys:  # a get, then a put of the same batch
            return last[1]
        groups = _Groups(keys)
        self._last = (keys, groups)
        return groups

    def get(self, keys: KeyBatch) -> pa.Array:
        self._cleanup(keys)
        if self._reg.ttl is not None:
            return self._get_ttl(keys)
        g, tables = self._grouped(keys), self._tables
        out: list[Any] = []
        for kg, a, b in g.groups:
            t = tables.get(kg)
            out.extend(repeat(None, b - a) if t is None else map(t.data.get, g.keys[a:b]))
        return pa.array(out, type=self._reg.serializer.arrow_type).take(g.inverse())

    def _get_ttl(self, keys: KeyBatch) -> pa.Array:
        tables, reg, out = self._tables, self._reg, []
        now = self._be.clock() if reg.ttl is not None else 0
        for kb, kg in zip(keys.keys, keys.key_groups.tolist(), strict=True):
            t = tables.get(kg)
            v = None if t is None else t.data.get(kb)
            if v is not None and reg.ttl is not None:
                value, expiry = v
                if expiry <= now and not reg.visible(expiry, now):
                    t.delete(kb)  # type: ignore[union-attr]
                    value = None
                elif expiry > now and reg.refresh_on_read:
                    t.put(kb, (value, reg.expiry(now)))  # type: ignore[union-attr]
                v = value
            out.append(v)
        return pa.array(out, type=reg.serializer.arrow_type)

    def put(self, keys: KeyBatch, values: pa.Array) -> None:
        from sluice.state.hashmap.tables import Table

        self._cleanup(keys)
        tables, reg = self._tables, self._reg
        if reg.ttl is None and not values.null_count:
            g = self._grouped(keys)
            vs = values.take(pa.array(g.order)).to_pylist()
            for kg, a, b in g.groups:
                t = tables.get(kg)
                if t is None:
                    t = tables[kg] = Table()
                t.writable().update(zip(g.keys[a:b], vs[a:b], strict=True))
                if t.owned is not None:
                    t.owned.update(g.keys[a:b])
                if t.dirty is not None:
                    t.dirty.update(g.keys[a:b])
            return
        expiry = reg.expiry(self._be.clock()) if reg.ttl is not None else None
        for kb, kg, v in zip(keys.keys, keys.key_groups.tolist(), values.to_pylist(), strict=True):
            t = tables.get(kg)
            if v is None:
                if t is not None:
                    t.delete(kb)
                continue
            if t is None:
                t = tables[kg] = Table()
            t.put(kb, v if expiry is None else (v, expiry))

    def delete(self, keys: KeyBatch) -> None:
        self._cleanup(keys)
        tables = self._tables
        for kb, kg in zip(keys.keys, keys.key_groups.tolist(), strict=True):
            t = tables.get(kg)
            if t is not None:
                t.delete(kb)


class _Groups:
    """A batch's keys in key-group order (stable: a repeated key keeps its order) and each key group's
    ``(key group, start, end)`` in that order."""

    __slots__ = ("groups", "keys", "order")

    def __init__(self, batch: KeyBatch) -> None:
        kgs = batch.key_groups
        self.order = np.argsort(kgs, kind="stable")
        ordered = kgs[self.order]
        cuts = (np.flatnonzero(np.diff(ordered)) + 1).tolist() if len(ordered) else []
        starts, ends = [0, *cuts], [*cuts, len(ordered)]
        self.groups = [(int(ordered[a]), a, b) for a, b in zip(starts, ends, strict=True) if b > a]
        fixed = batch.fixed
        self.keys = rows_as_bytes(fixed[self.order]) if fixed is not None else [batch.keys[i] for i in self.order.tolist()]

    def inverse(self) -> pa.Array:
        """Where each row of the batch is in key-group order."""
        where = np.empty_like(self.order)
        where[self.order] = np.arange(len(self.order))
        return pa.array(where)
