"""The RocksDB backend's state handles: per key (value, list, map) and batch-wise (value).

Entry values are the serializer's bytes, after the 8-byte expiry time for a state with a TTL. A list is one
entry: its elements back to back, each ``[expiry] | u32 length | bytes`` (appending reads and rewrites the
entry: rocksdict has no merge operator). A map is one entry per map key: ``state key | map key bytes``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from sluice.state.keycodec import rows_as_bytes
from sluice.state.meta import RegisteredState, pack_expiry, unpack_expiry
from sluice.state.spi import BatchValueState, KeyBatch

if TYPE_CHECKING:
    from sluice.state.rocksdb.backend import RocksDBKeyedStateBackend

__all__ = ["RocksBatchValueState", "RocksListState", "RocksMapState", "RocksValueState", "successor"]


def successor(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with ``prefix``."""
    p = prefix.rstrip(b"\xff")
    return p[:-1] + bytes([p[-1] + 1]) if p else b"\xff" * (len(prefix) + 1)


def split_list(ttl: bool, data: bytes) -> list[tuple[bytes, int | None]]:
    """A list entry's elements as (bytes, expiry); ``ttl``: the elements carry an expiry time."""
    out, at, n = [], 0, len(data)
    while at < n:
        expiry = None
        if ttl:
            expiry = unpack_expiry(data, at)
            at += 8
        size = int.from_bytes(data[at : at + 4], "big")
        out.append((data[at + 4 : at + 4 + size], expiry))
        at += 4 + size
    return out


def join_list(elements: Iterable[tuple[bytes, int | None]]) -> bytes:
    """Elements (bytes, expiry) as a list entry."""
    return b"".join(
        (b"" if e is None else pack_expiry(e)) + len(v).to_bytes(4, "big") + v for v, e in elements
    )


class _Handle:
    def __init__(self, backend: RocksDBKeyedStateBackend, reg: RegisteredState) -> None:
        self._be = backend
        self._reg = reg
        self.descriptor: Any = None  # the descriptor the handle was made for
        self._tick = reg.ttl is not None and reg.ttl.cleanup_in_background
        backend.cached_states.add(reg.sid)  # reads and writes go through the cache

    def _key(self) -> bytes:
        if self._tick:
            self._be.background_cleanup(self._reg, 1)
        return self._be.entry_key(self._reg.sid)

    def clear(self) -> None:
        """Clear the current key's value."""
        self._be.delete(self._key())


class RocksValueState(_Handle):
    """One value for the current key."""

    def value(self) -> Any:
        """The value for the current key, or the descriptor's default."""
        k = self._key()
        raw = self._be.get(k)
        if raw is None:
            return self._reg.default
        reg = self._reg
        if reg.ttl is None:
            return reg.serializer.decode(raw)
        expiry, now = unpack_expiry(raw), self._be.clock()
        if expiry <= now:
            if not reg.visible(expiry, now):
                self._be.delete(k)
                return reg.default
        elif reg.refresh_on_read:
            self._be.put(k, pack_expiry(reg.expiry(now)) + raw[8:])
        return reg.serializer.decode(raw[8:])

    def update(self, value: Any) -> None:
        """Replace the value for the current key (``None`` clears it)."""
        if value is None:
            self.clear()
            return
        data = self._reg.serializer.encode(value)
        if self._reg.ttl is not None:
            data = pack_expiry(self._reg.expiry(self._be.clock())) + data
        self._be.put(self._key(), data)


class RocksListState(_Handle):
    """A list for the current key."""

    def get(self) -> list[Any]:
        """A copy of the list (empty if none)."""
        k = self._key()
        raw = self._be.get(k)
        if not raw:
            return []
        reg = self._reg
        elements = split_list(reg.ttl is not None, raw)
        if reg.ttl is not None:
            now = self._be.clock()
            live: list[tuple[bytes, int | None]] = [(v, e) for v, e in elements if e is not None and e > now]
            if len(live) < len(elements) and reg.ttl.visibility == "never_return_expired":
                self._be.put(k, join_list(live)) if live else self._be.delete(k)
                elements = live
            if reg.refresh_on_read and elements:
                self._be.put(k, join_list((v, reg.expiry(now)) for v, _ in elements))
        return [reg.serializer.decode(v) for v, _ in elements]

    def add(self, value: Any) -> None:
        """Append ``value``."""
        self.add_all([value])

    def add_all(self, values: Iterable[Any]) -> None:
        """Append every value."""
        new = self._encode(values)
        if new:
            k = self._key()
            self._be.put(k, (self._be.get(k) or b"") + new)

    def update(self, values: Iterable[Any]) -> None:
        """Replace the list (an empty one clears it)."""
        new = self._encode(values)
        self._be.put(self._key(), new) if new else self.clear()

    def _encode(self, values: Iterable[Any]) -> bytes:
        expiry = self._reg.expiry(self._be.clock()) if self._reg.ttl is not None else None
        return join_list((self._reg.serializer.encode(v), expiry) for v in values)


class RocksMapState(_Handle):
    """A map for the current key: one RocksDB entry per map key."""

    def _entries(self) -> Iterator[tuple[bytes, bytes]]:
        base = self._key()
        return self._be.scan(base, successor(base), len(base))

    def _live(self, k: bytes, raw: bytes | None) -> bytes | None:
        reg = self._reg
        if raw is None or reg.ttl is None:
            return raw
        expiry, now = unpack_expiry(raw), self._be.clock()
        if expiry <= now:
            if not reg.visible(expiry, now):
                self._be.delete(k)
                return None
        elif reg.refresh_on_read:
            self._be.put(k, pack_expiry(reg.expiry(now)) + raw[8:])
        return raw[8:]

    def get(self, key: Any, default: Any = None) -> Any:
        """The value of ``key``, or ``default``."""
        assert self._reg.key_serializer is not None
        k = self._key() + self._reg.key_serializer.encode(key)
        raw = self._live(k, self._be.get(k))
        return default if raw is None else self._reg.serializer.decode(raw)

    def put(self, key: Any, value: Any) -> None:
        """Set ``key`` to ``value``."""
        assert self._reg.key_serializer is not None
        data = self._reg.serializer.encode(value)
        if self._reg.ttl is not None:
            data = pack_expiry(self._reg.expiry(self._be.clock())) + data
        self._be.put(self._key() + self._reg.key_serializer.encode(key), data)

    def put_all(self, entries: dict[Any, Any]) -> None:
        """Set every entry."""
        for k, v in entries.items():
            self.put(k, v)

    def remove(self, key: Any) -> None:
        """Remove ``key`` if present."""
        assert self._reg.key_serializer is not None
        self._be.delete(self._key() + self._reg.key_serializer.encode(key))

    def contains(self, key: Any) -> bool:
        """Whether ``key`` has a value."""
        return self.get(key, _MISSING) is not _MISSING

    def items(self) -> Iterator[tuple[Any, Any]]:
        """The entries (read now)."""
        ks, vs = self._reg.key_serializer, self._reg.serializer
        assert ks is not None
        base = self._be.entry_key(self._reg.sid)
        out = []
        for uk, raw in list(self._entries()):
            live = self._live(base + uk, raw)
            if live is not None:
                out.append((ks.decode(uk), vs.decode(live)))
        return iter(out)

    def keys(self) -> Iterator[Any]:
        """The keys (read now)."""
        return iter([k for k, _ in self.items()])

    def values(self) -> Iterator[Any]:
        """The values (read now)."""
        return iter([v for _, v in self.items()])

    def is_empty(self) -> bool:
        """Whether the map has no entry."""
        return next(self.items(), None) is None

    def clear(self) -> None:
        """Remove every entry of the current key."""
        base = self._key()
        self._be.delete_many([base + uk for uk, _ in self._be.scan(base, successor(base), len(base))])


_MISSING = object()


class RocksBatchValueState(BatchValueState):
    """Batch-wise access to a value state of the RocksDB backend: the cache, then one multi-get of its
    misses; writes into the cache (or one sorted write batch without a cache)."""

    def __init__(self, backend: RocksDBKeyedStateBackend, reg: RegisteredState) -> None:
        self._be = backend
        self._reg = reg
        self._last: tuple[KeyBatch, list[bytes], np.ndarray | None] | None = None  # the last batch's keys
        self._through = False  # written with insert(): reads do not fill the cache

    def _keys(self, keys: KeyBatch, sort: bool = False) -> tuple[list[bytes], np.ndarray | None]:
        """The storage keys of a batch and, when they were sorted (fixed-width keys without a cache, or
        ``sort``: RocksDB reads and writes sorted keys faster), the rows in their order (a stable sort)."""
        if self._reg.ttl is not None and self._reg.ttl.cleanup_in_background:
            self._be.background_cleanup(self._reg, len(keys))
        last = self._last
        if last is not None and last[0] is keys and (last[2] is not None or not sort):  # a get, then a put
            return last[1], last[2]
        sid = self._reg.sid
        fixed = keys.fixed
        order = None
        if fixed is not None:
            # key group (u16) | state | key | empty namespace (u16 0), for every row at once
            n, width = fixed.shape
            rows = np.zeros((n, 2 + len(sid) + width + 2), dtype=np.uint8)
            rows[:, :2] = keys.key_groups.astype(">u2").view(np.uint8).reshape(n, 2)
            rows[:, 2 : 2 + len(sid)] = np.frombuffer(sid, dtype=np.uint8)
            rows[:, 2 + len(sid) : 2 + len(sid) + width] = fixed
            if sort or not self._be.cache.enabled:
                order = np.argsort(rows.view(f"S{rows.shape[1]}").ravel(), kind="stable")
                rows = rows[order]
            out = rows_as_bytes(rows)
        else:
            pfx = self._be.kg_prefixes
            out = [pfx[kg] + sid + kb + b"\x00\x00" for kg, kb in zip(keys.key_groups.tolist(), keys.keys, strict=True)]
        self._last = (keys, out, order)
        return out, order

    def get(self, keys: KeyBatch) -> pa.Array:
        ks, order = self._keys(keys)
        if not self._through:
            self._be.cached_states.add(self._reg.sid)
        raw = self._be.cache.get_many(ks, ordered=order is not None, remember=not self._through)
        reg = self._reg
        if reg.ttl is not None:
            now, expired, refresh = self._be.clock(), [], []
            out: list[bytes | None] = []
            for k, r in zip(ks, raw, strict=True):
                if r is None:
                    out.append(None)
                    continue
                e = unpack_expiry(r)
                if e <= now and not reg.visible(e, now):
                    expired.append(k)
                    out.append(None)
                    continue
                if e > now and reg.refresh_on_read:
                    refresh.append((k, pack_expiry(reg.expiry(now)) + r[8:]))
                out.append(r[8:])
            self._be.delete_many(expired)
            self._be.put_many(refresh)
            raw = out
        values = reg.serializer.decode_array(raw)
        if order is None:
            return values
        where = np.empty_like(order)
        where[order] = np.arange(len(order))
        return values.take(pa.array(where))

    def put(self, keys: KeyBatch, values: pa.Array) -> None:
        ks, order = self._keys(keys)
        if order is not None:
            values = values.take(pa.array(order))
        data = self._reg.serializer.encode_array(values)
        if self._reg.ttl is not None:
            head = pack_expiry(self._reg.expiry(self._be.clock()))
            data = [None if d is None else head + d for d in data]
        self._be.cached_states.add(self._reg.sid)
        width = self._reg.serializer.width
        nbytes = len(ks) * (len(ks[0]) + width + (8 if self._reg.ttl else 0)) if width and keys.fixed is not None and ks else None
        self._be.cache.put_many(ks, data, ordered=order is not None, nbytes=nbytes)

    def delete(self, keys: KeyBatch) -> None:
        ks, order = self._keys(keys)
        self._be.cached_states.add(self._reg.sid)
        self._be.cache.put_many(ks, [None] * len(ks), ordered=order is not None)

    def insert(self, keys: KeyBatch, values: pa.Array) -> None:
        """Straight to RocksDB in one sorted write batch (the cache forgets these keys)."""
        if self._reg.ttl is not None:
            self.put(keys, values)
            return
        ks, order = self._keys(keys, sort=True)
        if order is not None:
            values = values.take(pa.array(order))
        data = self._reg.serializer.encode_array(values)
        self._be.cache.write_through(ks, data, ordered=order is not None, cached=self._be.raw_writes or self._reg.sid in self._be.cached_states)
        self._through = True
