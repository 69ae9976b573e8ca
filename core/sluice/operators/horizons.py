"""Deduplication state for ``keep="first"``: each key's horizon start, in value states per *time bucket*,
dropped whole when the clock passes the bucket (no scan of entries), with a Bloom filter per bucket.

A horizon that starts at ``t`` lives in the state of bucket ``t // width`` (``width`` = a quarter of the
horizon, at least 1 ms); every horizon of bucket ``b`` has ended once the clock (watermark, or processing
time) reaches ``(b + 1) * width + within``, and the bucket's state is then dropped with
:meth:`~sluice.state.spi.KeyedStateBackend.drop_state` (RocksDB: one range deletion per key group, as
Flink's TTL compaction filter or Arroyo's whole bins). State thus holds at most ``within + width`` of
horizons, and no entry is ever visited to expire it.

A key is looked up in the buckets from the newest to the oldest; a bucket is only read for the keys its
Bloom filter may hold (a NumPy filter of the keys' 64-bit hashes, kept in memory by this subtask, never
wrong about an absent key): keys seen for the first time (the common case of deduplication) cost no read
at all. A bucket restored from a checkpoint has no filter: every key is read in it, until it is dropped.
A found start counts only while its horizon is open at the clock (``start + within > now``), as a state
TTL that follows the clock would have it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from sluice.state.api import ValueStateDescriptor
from sluice.state.keygroups import hash_columns
from sluice.state.spi import BatchValueState, KeyBatch, KeyedStateBackend

__all__ = ["Bloom", "HorizonStore", "bucket_state_name"]

_PREFIX = "horizon@"
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def bucket_state_name(bucket: int) -> str:
    """The value state that holds the horizons starting in ``bucket``."""
    return f"{_PREFIX}{bucket}"


class Bloom:
    """A scalable, blocked Bloom filter of 64-bit hashes, all NumPy: segments of doubling capacity, each a
    bit array of 32 bits per key where a key sets 6 bits of one 64-bit word (one gather per key and segment;
    about 0.1% false positives)."""

    K = 6
    FIRST = 1 << 16

    def __init__(self, expected: int = FIRST) -> None:
        self._segments: list[tuple[np.ndarray, int]] = []  # (uint64 words, capacity)
        self._room = 0  # keys the last segment can still take
        self._first = 1 << max(16, int(expected - 1).bit_length())  # a power of two >= expected

    def __len__(self) -> int:
        return sum(cap for _, cap in self._segments) - self._room

    @classmethod
    def probe(cls, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """What :meth:`add` and :meth:`may_hold` take: per hash, a mixed hash that picks its word (in any
        segment) and its mask of K bits (from K 6-bit fields of the upper half: the lower bits pick key
        groups). Compute it once for the filters of several buckets."""
        mask = np.zeros(len(hashes), np.uint64)
        for i in range(cls.K):
            mask |= np.uint64(1) << ((hashes >> np.uint64(28 + 6 * i)) & np.uint64(63))
        return _mix(hashes), mask

    def add(self, probe: tuple[np.ndarray, np.ndarray]) -> None:
        """Remember the hashes of ``probe`` (:meth:`probe`)."""
        mixed, masks = probe
        while len(mixed):
            if not self._room:
                cap = self._segments[-1][1] * 2 if self._segments else self._first
                self._segments.append((np.zeros(cap // 2, np.uint64), cap))  # 32 bits per key
                self._room = cap
            words, _ = self._segments[-1]
            n = min(self._room, len(mixed))
            word = (mixed[:n] & np.uint64(len(words) - 1)).astype(np.intp)
            np.bitwise_or.at(words, word, masks[:n])
            mixed, masks = mixed[n:], masks[n:]
            self._room -= n

    def may_hold(self, probe: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        """Per hash of ``probe`` (:meth:`probe`), whether it may have been added (False: it certainly was
        not)."""
        mixed, mask = probe
        out = np.zeros(len(mixed), bool)
        for words, _ in self._segments:
            out |= (words[(mixed & np.uint64(len(words) - 1)).astype(np.intp)] & mask) == mask
        return out


class HorizonStore:
    """Each key's latest horizon start, in bucket states of ``backend`` (module docstring).

    Args:
        backend: the operator's keyed backend.
        within: the horizon in ms.
    """

    def __init__(self, backend: KeyedStateBackend, within: int) -> None:
        self.backend = backend
        self.within = within
        self.width = max(1, within // 4)
        self._states: dict[int, BatchValueState] = {}
        self._blooms: dict[int, Bloom | None] = {}  # None: restored, no filter

    def _state(self, bucket: int, bloom: bool) -> BatchValueState:
        state = self._states.get(bucket)
        if state is None:
            desc = ValueStateDescriptor(bucket_state_name(bucket), serializer="int64")
            state = self._states[bucket] = self.backend.batch_state(desc)
            # sized for as many keys as the newest bucket holds (one segment when the rate is steady)
            sizes = [len(f) for f in self._blooms.values() if f is not None]
            self._blooms[bucket] = Bloom(max(sizes, default=Bloom.FIRST)) if bloom else None
        return state

    def restored(self) -> None:
        """Open the buckets a restore brought (without filters)."""
        for name in self.backend.state_meta():
            if name.startswith(_PREFIX):
                self._state(int(name[len(_PREFIX) :]), bloom=False)

    @property
    def buckets(self) -> list[int]:
        """The buckets held now (oldest first)."""
        return sorted(self._states)

    @staticmethod
    def hashes(keys: KeyBatch, columns: Sequence[pa.Array]) -> np.ndarray:
        """The 64-bit hashes of a batch's keys (the ones its key groups came from, when it kept them)."""
        return keys.hashes if keys.hashes is not None else hash_columns(columns)

    def lookup(self, keys: KeyBatch, hashes: np.ndarray, now: int) -> tuple[np.ndarray, np.ndarray]:
        """Per key, whether it has a horizon open at ``now`` and its start (0 where none)."""
        n = len(keys)
        start = np.zeros(n, np.int64)
        has = np.zeros(n, bool)
        todo = np.ones(n, bool)
        probe = Bloom.probe(hashes)
        for b in sorted(self._states, reverse=True):
            if (b + 1) * self.width + self.within <= now:
                break  # this bucket and the older ones hold no open horizon
            bloom = self._blooms[b]
            rows = np.flatnonzero(todo & bloom.may_hold(probe) if bloom is not None else todo)
            if not len(rows):
                continue
            got = self._states[b].get(_take(keys, rows))
            valid = np.asarray(got.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
            found = rows[valid]
            start[found] = np.asarray(got.filter(pa.array(valid)).to_numpy(zero_copy_only=False), dtype=np.int64)
            has[found] = True
            todo[found] = False
            if not todo.any():
                break
        has &= start + self.within > now
        start[~has] = 0
        return has, start

    def write(self, keys: KeyBatch, hashes: np.ndarray, starts: np.ndarray, now: int) -> None:
        """Store the new horizon starts of ``keys`` (one per key), each in the bucket of its start; a horizon
        already over at ``now`` is not stored."""
        live = np.flatnonzero(starts + self.within > now)
        if not len(live):
            return
        buckets = starts[live] // self.width
        mixed, masks = Bloom.probe(hashes[live])
        for b in np.unique(buckets).tolist():
            mine = buckets == b
            rows = live[mine]
            state = self._state(b, bloom=True)
            state.insert(_take(keys, rows), pa.array(starts[rows], pa.int64()))
            bloom = self._blooms[b]
            if bloom is not None:
                bloom.add((mixed[mine], masks[mine]))

    def next_expiry(self) -> int | None:
        """When the oldest bucket may be dropped (None: no bucket)."""
        return (min(self._states) + 1) * self.width + self.within if self._states else None

    def expire(self, now: int) -> int:
        """Drop every bucket whose horizons have all ended at ``now``; how many were dropped."""
        gone = [b for b in self._states if (b + 1) * self.width + self.within <= now]
        for b in gone:
            self.backend.drop_state(bucket_state_name(b))
            del self._states[b], self._blooms[b]
        return len(gone)


def _take(keys: KeyBatch, rows: np.ndarray) -> KeyBatch:
    if len(rows) == len(keys):
        return keys
    if keys.fixed is not None:
        return KeyBatch(None, keys.key_groups[rows], keys.fixed[rows])
    all_keys = keys.keys
    return KeyBatch([all_keys[i] for i in rows.tolist()], keys.key_groups[rows])
