"""Timers in RocksDB: ``key group | timer state | timestamp (sortable) | key | namespace``, so they scale
beyond memory; only each key group's earliest timestamp is cached in memory."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from sluice.state.keycodec import key_end, namespace_part, state_id
from sluice.state.meta import EVENT_TIMERS, PROC_TIMERS
from sluice.state.rocksdb.states import successor
from sluice.state.spi import TimeDomain, Timer, TimerService

if TYPE_CHECKING:
    from sluice.state.rocksdb.backend import RocksDBKeyedStateBackend

__all__ = ["RocksDBTimerService", "decode_timer", "encode_timestamp"]

_SIGN = 1 << 63
_SIDS = (state_id(EVENT_TIMERS), state_id(PROC_TIMERS))
_EMPTY = object()


def encode_timestamp(ts: int) -> bytes:
    """A timestamp as 8 bytes that sort as the numbers do."""
    return ((ts + _SIGN) & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "big")


def decode_timer(entry: bytes, at: int) -> tuple[int, bytes, bytes]:
    """(timestamp, key, namespace) of a timer entry whose timestamp starts at ``entry[at:]``."""
    ts = int.from_bytes(entry[at : at + 8], "big") - _SIGN
    end = key_end(entry, at + 8)
    return ts, entry[at + 8 : end], entry[end + 2 :]


class RocksDBTimerService(TimerService):
    """Event- and processing-time timers of a RocksDB keyed backend."""

    def __init__(self, backend: RocksDBKeyedStateBackend) -> None:
        self._be = backend
        self._heads: dict[tuple[int, int], object] = {}  # (domain, key group) -> earliest ts or _EMPTY

    def _prefix(self, domain: TimeDomain, key_group: int) -> bytes:
        return self._be.kg_prefixes[key_group] + _SIDS[domain]

    def _entry(self, domain: TimeDomain, ts: int, kg: int, key: bytes, ns: bytes) -> bytes:
        return self._prefix(domain, kg) + encode_timestamp(ts) + key + namespace_part(ns)

    def register(self, domain: TimeDomain, timestamp: int, key_group: int, key: bytes, namespace: bytes = b"") -> None:
        self._be.put(self._entry(domain, timestamp, key_group, key, namespace), b"")
        head = self._heads.get((domain, key_group))
        if head is _EMPTY or (isinstance(head, int) and timestamp < head):
            self._heads[(domain, key_group)] = timestamp

    def delete(self, domain: TimeDomain, timestamp: int, key_group: int, key: bytes, namespace: bytes = b"") -> None:
        self._be.delete(self._entry(domain, timestamp, key_group, key, namespace))
        if self._heads.get((domain, key_group)) == timestamp:
            del self._heads[(domain, key_group)]

    def _head(self, domain: TimeDomain, kg: int) -> int | None:
        head = self._heads.get((domain, kg))
        if head is None:
            prefix = self._prefix(domain, kg)
            first = next(self._be.scan(prefix, successor(prefix), len(prefix)), None)
            head = self._heads[(domain, kg)] = _EMPTY if first is None else decode_timer(first[0], 0)[0]
        return None if head is _EMPTY else head  # type: ignore[return-value]

    def pop_due(self, domain: TimeDomain, upto: int) -> list[Timer]:
        due: list[Timer] = []
        for kg in self._be.key_groups:
            head = self._head(domain, kg)
            if head is None or head > upto:
                continue
            prefix = self._prefix(domain, kg)
            # the end of event time (2**63 - 1) has no successor timestamp: scan to the end of the prefix
            stop = successor(prefix) if upto >= _SIGN - 1 else prefix + encode_timestamp(upto + 1)
            found = list(self._be.scan(prefix, stop, len(prefix)))
            self._be.delete_many([prefix + rest for rest, _ in found])
            due.extend(Timer(ts, kg, key, ns) for ts, key, ns in (decode_timer(rest, 0) for rest, _ in found))
            self._heads.pop((domain, kg), None)
        due.sort()
        return due

    def next_timestamp(self, domain: TimeDomain) -> int | None:
        heads = [h for kg in self._be.key_groups if (h := self._head(domain, kg)) is not None]
        return min(heads) if heads else None

    def timers(self, domain: TimeDomain) -> Iterator[Timer]:
        for kg in self._be.key_groups:
            prefix = self._prefix(domain, kg)
            for rest, _ in list(self._be.scan(prefix, successor(prefix), len(prefix))):
                ts, key, ns = decode_timer(rest, 0)
                yield Timer(ts, kg, key, ns)

    def forget(self) -> None:
        """Drop the cached heads (after a restore changed the database)."""
        self._heads.clear()
