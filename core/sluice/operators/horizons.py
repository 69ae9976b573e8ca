"""Deduplication state for ``keep="first"``: each key's horizon start, in value states per *time bucket*,
dropped whole when the clock passes the bucket (no scan of entries), with a Bloom filter per bucket.

A horizon that starts at ``t`` lives in the state of bucket ``t // width`` (``width`` = a quarter of the
horizon, at least 1 ms); every horizon of bucket ``b`` has ended once the clock (watermark, or processing
time) reaches ``(b + 1) * width + within``, and the bucket's state is then dropped with
:meth:`~sluice.state.spi.KeyedStateBackend.drop_state` (RocksDB: one range deletion per key group, as
Flink's TTL compaction filter or Arroyo's whole bins). State thus holds at most ``within + width`` of
horizons, and no entry is ever visited to expire it.

A key is looked up in the buckets from the newest to the oldest; a bucket is only read for the keys its
Bloom filter may hold (a NumPy filter of 64-bit hashes of the encoded keys, kept in memory by this subtask,
never wrong about a key it was given): keys seen for the first time (the common case of deduplication) cost
no read at all. The filters are not checkpointed: a restore rebuilds each restored bucket's filter from the
keys the bucket's state holds in this subtask's key groups (one scan of their stored keys, nothing
decoded), so the filter is exact after a rescale too, and a restored job reads no more than a running one.
A found start counts only while its horizon is open at the clock (``start + within > now``), as a state
TTL that follows the clock would have it.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from sluice.state.api import ValueStateDescriptor
from sluice.state.keycodec import binary_parts
from sluice.state.spi import BatchValueState, KeyBatch, KeyedStateBackend

__all__ = ["Bloom", "HorizonStore", "bucket_state_name", "key_hashes"]

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


def _hash_rows(rows: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each row of an ``(n, width)`` uint8 matrix (encoded keys of one width): the row's
    8-byte words, zero-padded, mixed in one after the other into a start that depends on the width."""
    n, width = rows.shape
    words = -(-width // 8)
    padded = np.zeros((n, words * 8), np.uint8)
    padded[:, :width] = rows
    w = padded.view("<u8")
    h = np.full(n, _mix(np.array([width], np.uint64))[0], np.uint64)
    for j in range(words):
        h = _mix(h ^ w[:, j])
    return h


def _hash_binary(keys: pa.Array) -> np.ndarray:
    """:func:`_hash_rows` of a binary array of keys of any widths: the keys of each width as one matrix."""
    buf, starts, widths = binary_parts(keys)
    n = len(widths)
    if n and (widths == widths[0]).all():  # one width (int keys): the bytes as one matrix
        return _hash_rows(buf[starts[0] : starts[0] + n * widths[0]].reshape(n, int(widths[0])))
    out = np.zeros(len(widths), np.uint64)
    for width in np.unique(widths).tolist():
        rows = np.flatnonzero(widths == width)
        out[rows] = _hash_rows(buf[starts[rows, None] + np.arange(width)])
    return out


def key_hashes(keys: KeyBatch) -> np.ndarray:
    """A 64-bit hash of each encoded key of ``keys`` (uint64): the same for the same bytes whether the batch
    holds them as a fixed-width matrix or as a list, and computable from the keys a state stores, which is
    how a restore rebuilds the filters. Not the key-group hash: that one needs the key columns' types."""
    return _hash_rows(keys.fixed) if keys.fixed is not None else _hash_binary(pa.array(keys.keys, pa.binary()))


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
        segment) and its mask of K bits (from K 6-bit fields of the upper bits). Compute it once for the
        filters of several buckets."""
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
        self._blooms: dict[int, Bloom] = {}

    def _state(self, bucket: int) -> BatchValueState:
        state = self._states.get(bucket)
        if state is None:
            desc = ValueStateDescriptor(bucket_state_name(bucket), serializer="int64")
            state = self._states[bucket] = self.backend.batch_state(desc)
            # sized for as many keys as the newest bucket holds (one segment when the rate is steady)
            self._blooms[bucket] = Bloom(max((len(f) for f in self._blooms.values()), default=Bloom.FIRST))
        return state

    def restored(self) -> None:
        """Open the buckets a restore brought, each with its filter rebuilt from the keys its state holds."""
        for name in self.backend.state_meta():
            if name.startswith(_PREFIX):
                bucket = int(name[len(_PREFIX) :])
                self._state(bucket)
                groups = [keys for _, keys in self.backend.encoded_keys(name)]
                bloom = self._blooms[bucket] = Bloom(sum(map(len, groups)))
                for keys in groups:
                    if len(keys):
                        bloom.add(Bloom.probe(_hash_binary(keys)))

    @property
    def buckets(self) -> list[int]:
        """The buckets held now (oldest first)."""
        return sorted(self._states)

    def lookup(self, keys: KeyBatch, hashes: np.ndarray, now: int) -> tuple[np.ndarray, np.ndarray]:
        """Per key, whether it has a horizon open at ``now`` and its start (0 where none); ``hashes`` are
        :func:`key_hashes` of ``keys``."""
        n = len(keys)
        start = np.zeros(n, np.int64)
        has = np.zeros(n, bool)
        todo = np.ones(n, bool)
        probe = Bloom.probe(hashes)
        for b in sorted(self._states, reverse=True):
            if (b + 1) * self.width + self.within <= now:
                break  # this bucket and the older ones hold no open horizon
            rows = np.flatnonzero(todo & self._blooms[b].may_hold(probe))
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
        """Store the new horizon starts of ``keys`` (one per key, ``hashes`` their :func:`key_hashes`), each in
        the bucket of its start; a horizon already over at ``now`` is not stored."""
        live = np.flatnonzero(starts + self.within > now)
        if not len(live):
            return
        buckets = starts[live] // self.width
        mixed, masks = Bloom.probe(hashes[live])
        for b in np.unique(buckets).tolist():
            mine = buckets == b
            rows = live[mine]
            self._state(b).insert(_take(keys, rows), pa.array(starts[rows], pa.int64()))
            self._blooms[b].add((mixed[mine], masks[mine]))

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
