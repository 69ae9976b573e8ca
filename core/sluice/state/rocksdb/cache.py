"""The RocksDB backend's point access: a bounded write-back cache of entries in front of the database.

Every point read and write of a keyed backend (per-key handles, batch-wise access, timers) goes through an
:class:`EntryCache`. With a budget (``write_cache_ratio`` of the memory budget) it keeps recently read or
written entries as the bytes RocksDB would hold (TTL expiry included), so hot keys cost a dict operation:

* reads check the cache, then read the misses with one sorted multi-get and keep what they found (absent
  keys too, as known-absent);
* writes and deletes go to the cache only and mark the entry dirty;
* dirty entries reach RocksDB (sorted write batches) in the synchronous part of every snapshot, before
  the native checkpoint, before any scan of the database (map iteration, timers, ``keys``, TTL cleanup),
  and when the cache outgrows its budget: then it writes every dirty entry and keeps the newest entries
  up to half of its budget (first read or written back, first out: a hit costs no bookkeeping).

Without a budget (``write_cache_ratio=0``) reads and writes go straight to RocksDB, still sorted and
batched. Either way, what a reader sees is the same (tested with random operations and checkpoints).
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from itertools import compress, islice, repeat
from typing import Any

import numpy as np

from sluice.state.rocksdb.resources import rocksdict_module

__all__ = ["EntryCache"]

_MISSING: Any = object()
#: Python's own memory per cached entry besides its key's and value's bytes: two bytes objects' headers
#: and a dict slot with its spare room (measured with tracemalloc: 95 to 120 bytes; rounded up)
ENTRY_OVERHEAD = 150
#: entries per write batch when the cache writes back (bounds the batch's own memory)
_CHUNK = 20_000
#: a size check that finds the cache above this part of its budget makes room (so checks stay rare)
_HIGH = 0.9


class EntryCache:
    """Point reads and writes of one RocksDB instance, through a write-back cache of ``budget()`` bytes.

    Two dicts of storage key -> value bytes (None: absent): ``dirty``, every write since the last
    write-back (what RocksDB does not have yet), and ``clean``, what was read from or written back to
    RocksDB. A read looks in ``dirty``, then ``clean``, then RocksDB; a write touches ``dirty`` only, so
    a read-modify-write of a hot key costs two dict operations.

    Args:
        db: the database now (it changes when a restore replaces it).
        write_options: the write options of every write.
        budget: the bytes this cache may hold now (0 at creation: no cache, reads and writes go straight
            to RocksDB).
    """

    def __init__(self, db: Callable[[], Any], write_options: Any, budget: Callable[[], int]) -> None:
        self._db = db
        self._wo = write_options
        self._budget = budget
        self.enabled = budget() > 0
        #: with change capture on (changelog checkpoints): every entry written since the last checkpoint,
        #: its last value (None: deleted)
        self.log: dict[bytes, bytes | None] | None = None
        self._dirty: dict[bytes, bytes | None] = {}
        self._clean: dict[bytes, bytes | None] = {}
        #: the cache's size in bytes at its last size check (keys, values and per-entry overhead)
        self.size = 0
        self._count = 0  # entries at the last size check
        self._added = 0  # key and value bytes put into either dict since (an upper bound of the growth)

    # -- reads ----------------------------------------------------------------------------------------
    def get(self, key: bytes) -> bytes | None:
        """The value of ``key`` (None: absent)."""
        if not self.enabled:
            value: bytes | None = self._db().get(key)
            return value
        value = self._dirty.get(key, _MISSING)
        if value is _MISSING:
            value = self._clean.get(key, _MISSING)
            if value is _MISSING:
                value = self._clean[key] = self._db().get(key)
                self._grew(len(key) + (len(value) if value else 0))
        return value

    def get_many(self, keys: Sequence[bytes], ordered: bool = False, remember: bool = True) -> list[bytes | None]:
        """The values of ``keys`` (None where absent), the cache's misses read with one sorted multi-get;
        ``ordered``: the keys are sorted already; not ``remember``: what was read is not kept."""
        if not self.enabled:
            return self._read(keys, ordered)
        n = len(keys)
        got = list(map(self._dirty.get, keys, repeat(_MISSING, n)))
        if _MISSING not in got:
            return got
        where = np.flatnonzero(np.fromiter(map(operator.is_, got, repeat(_MISSING, n)), dtype=bool, count=n)).tolist()
        missed = [keys[i] for i in where]
        found = list(map(self._clean.get, missed, repeat(_MISSING, len(missed))))
        if _MISSING in found:
            unread = list(set(compress(missed, map(operator.is_, found, repeat(_MISSING, len(found))))))
            if len(unread) > 1:
                unread = [unread[i] for i in _order(unread)]
            fetched = dict(zip(unread, self._db().get(unread), strict=True))
            found = list(map(fetched.get, missed, found))  # the value read where the cache had none
            if remember:
                self._clean.update(fetched)
                self._grew(sum(map(len, unread)) + sum(map(len, filter(None, fetched.values()))))
        for i, v in zip(where, found, strict=True):
            got[i] = v
        return got

    def _read(self, keys: Sequence[bytes], ordered: bool) -> list[bytes | None]:
        if ordered or len(keys) < 2:
            return self._db().get(list(keys))  # type: ignore[no-any-return]
        order = _order(keys)
        values = self._db().get([keys[i] for i in order])
        out: list[bytes | None] = [None] * len(keys)
        for i, v in zip(order, values, strict=True):
            out[i] = v
        return out

    # -- writes ---------------------------------------------------------------------------------------
    def put(self, key: bytes, value: bytes | None) -> None:
        """Set ``key`` to ``value`` (None deletes it)."""
        if self.log is not None:
            self.log[key] = value
        if not self.enabled:
            self._write([key], [value], True)
            return
        self._dirty[key] = value
        self._grew(len(key) + (len(value) if value else 0))

    def put_many(
        self, keys: Sequence[bytes], values: Sequence[bytes | None], ordered: bool = False, nbytes: int | None = None
    ) -> None:
        """Set each key to its value (None deletes); a key repeated keeps its last value.

        Args:
            ordered: the keys are sorted already (a repeated key's values in write order).
            nbytes: the keys' and values' bytes, if the caller knows them (else they are counted).
        """
        if self.log is not None:
            self.log.update(zip(keys, values, strict=True))
        if not self.enabled:
            self._write(keys, values, ordered)
            return
        self._dirty.update(zip(keys, values, strict=True))
        self._grew(sum(map(len, keys)) + sum(map(len, filter(None, values))) if nbytes is None else nbytes)

    def write_through(
        self, keys: Sequence[bytes], values: Sequence[bytes | None], ordered: bool = False, cached: bool = True
    ) -> None:
        """Write entries straight to RocksDB (past the cache, which forgets these keys): for entries seldom
        read back soon, which would only cost the cache's bookkeeping. Not ``cached``: the cache holds none
        of these keys (their state was only read without remembering and written through)."""
        if self.log is not None:
            self.log.update(zip(keys, values, strict=True))
        if cached and self.enabled and (self._dirty or self._clean):
            n = len(keys)
            deque(map(self._dirty.pop, keys, repeat(None, n)), maxlen=0)
            deque(map(self._clean.pop, keys, repeat(None, n)), maxlen=0)
        self._write(keys, values, ordered)

    def write(self, entries: Iterable[tuple[bytes, bytes | None]]) -> None:
        """Write ``(key, value)`` pairs in order (a None value deletes)."""
        pairs = list(entries)
        self.put_many([k for k, _ in pairs], [v for _, v in pairs])

    def _write(self, keys: Sequence[bytes], values: Sequence[bytes | None], ordered: bool) -> None:
        """Write straight to RocksDB in write batches, sorted by key (stable: a repeated key keeps its last
        value)."""
        if not ordered and len(keys) > 1:
            pick = operator.itemgetter(*_order(keys))  # a tuple of the items in that order, built in C
            keys, values = pick(keys), pick(values)
        rd = rocksdict_module()
        for at in range(0, len(keys), _CHUNK):
            wb = rd.WriteBatch(raw_mode=True)
            ks, vs = keys[at : at + _CHUNK], values[at : at + _CHUNK]
            if None in vs:
                for k, v in zip(ks, vs, strict=True):
                    if v is None:
                        wb.delete(k)
                    else:
                        wb.put(k, v)
            else:  # no deletes: one put per entry without a Python loop
                deque(map(wb.put, ks, vs), maxlen=0)
            self._db().write(wb, self._wo)

    # -- write-back and eviction ----------------------------------------------------------------------
    def flush(self) -> None:
        """Write every dirty entry to RocksDB; the cache keeps them as clean."""
        dirty = self._dirty
        if not dirty:
            return
        self._write(list(dirty), list(dirty.values()), False)
        self._clean.update(dirty)
        self._dirty = {}

    def clear(self) -> None:
        """Forget every entry, dirty ones too (the database was replaced)."""
        self._dirty, self._clean = {}, {}
        self.size = self._count = self._added = 0

    def forget(self, sid: bytes) -> None:
        """Forget the clean entries of state ``sid`` (after :meth:`flush`: the state was dropped from RocksDB)."""
        assert not self._dirty, "forget() follows a flush"
        at, end = 2, 2 + len(sid)
        self._clean = {k: v for k, v in self._clean.items() if k[at:end] != sid}
        self.size, self._count, self._added = self.measure(), len(self._clean), 0

    def __len__(self) -> int:
        return len(self._dirty) + len(self._clean)

    @property
    def dirty(self) -> int:
        """Entries written to the cache and not yet to RocksDB."""
        return len(self._dirty)

    def _grew(self, nbytes: int) -> None:
        self._added += nbytes
        if self.size + self._added + (len(self._dirty) + len(self._clean) - self._count) * ENTRY_OVERHEAD > self._budget():
            self._check()

    def measure(self) -> int:
        """The cache's size in bytes now: keys, values and :data:`ENTRY_OVERHEAD` per entry."""
        size = 0
        for d in (self._dirty, self._clean):
            size += sum(map(len, d)) + sum(map(len, filter(None, d.values()))) + len(d) * ENTRY_OVERHEAD
        return size

    def _check(self) -> None:
        """Measure; above :data:`_HIGH` of the budget, write back and keep the newest entries up to half of
        it (first read or written first out)."""
        budget = self._budget()
        size = self.measure()
        if size > _HIGH * budget:
            self.flush()  # dirty entries join the clean ones: ``size`` is still an upper bound
            clean = self._clean
            n = len(clean)
            keep = int(n * min(1.0, budget / 2 / size)) if size else 0
            self._clean = dict(islice(clean.items(), n - keep, None))
            size = size * keep // n if n else 0
        self.size, self._count, self._added = size, len(self._dirty) + len(self._clean), 0


def _order(keys: Sequence[bytes]) -> list[int]:
    """The positions of ``keys`` in ascending order (stable); NumPy sorts keys of one width."""
    width = len(keys[0])
    if width and min(map(len, keys)) == width == max(map(len, keys)):
        # all of one width, so NumPy's null-padded comparison of "S" strings is plain byte order
        return np.argsort(np.array(keys, dtype=f"S{width}"), kind="stable").tolist()  # type: ignore[no-any-return]
    return sorted(range(len(keys)), key=keys.__getitem__)
