"""Window state in the job's keyed state backend: per key group, a list of *segments*, each an Arrow IPC
blob of partial aggregates (:mod:`sluice.operators.windows.aggregates`), and a timer at the earliest time a
window of that key group fires or is cleaned up.

A flush appends one segment per key group it touches (only what changed since the last flush: on RocksDB
an incremental checkpoint uploads just those, with changelog checkpoints the change log holds just those);
firing a key group reads its segments, merges them and writes back one segment without the windows it
closed, so a closed window's state goes whole. State and timers are per key group, the unit of rescaling.
"""

from __future__ import annotations

import pyarrow as pa

from sluice.state.api import ListStateDescriptor
from sluice.state.keycodec import encode_key
from sluice.state.spi import KeyedStateBackend, TimeDomain

__all__ = ["SegmentStore", "from_blob", "to_blob"]

#: segments of a key group merged into one when a flush finds more
MAX_SEGMENTS = 16


def to_blob(table: pa.Table) -> bytes:
    """A table as an Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def from_blob(blob: bytes) -> pa.Table:
    """The table of an Arrow IPC stream."""
    return pa.ipc.open_stream(pa.py_buffer(blob)).read_all()


class SegmentStore:
    """The segments and timers of one window operator subtask."""

    def __init__(self, backend: KeyedStateBackend, domain: TimeDomain) -> None:
        self.backend = backend
        self.domain = domain
        self._segments = backend.state(ListStateDescriptor("window-segments", serializer="binary"))
        self._keys: dict[int, bytes] = {}
        self.next_timer: int | None = None  # the earliest timer (a lower bound; None: look it up)
        self._known = False

    def _at(self, kg: int) -> None:
        kb = self._keys.get(kg)
        if kb is None:
            kb = self._keys[kg] = encode_key(kg)
        self.backend.set_current_key(kg, kg, kb)

    def add(self, kg: int, table: pa.Table) -> int:
        """Append a segment to key group ``kg``; the number of segments it has now."""
        self._at(kg)
        self._segments.add(to_blob(table))
        return len(self._segments.get())

    def read(self, kg: int) -> list[pa.Table]:
        """The segments of key group ``kg``, oldest first."""
        self._at(kg)
        return [from_blob(b) for b in self._segments.get()]

    def replace(self, kg: int, table: pa.Table | None) -> None:
        """Make ``table`` (None or empty: nothing) the only segment of key group ``kg``."""
        self._at(kg)
        if table is None or not table.num_rows:
            self._segments.clear()
        else:
            self._segments.update([to_blob(table)])

    def timer(self, kg: int, timestamp: int) -> None:
        """Fire key group ``kg`` at ``timestamp``."""
        self.backend.timers.register(self.domain, timestamp, kg, self._key(kg))
        if self._known and (self.next_timer is None or timestamp < self.next_timer):
            self.next_timer = timestamp

    def _key(self, kg: int) -> bytes:
        kb = self._keys.get(kg)
        if kb is None:
            kb = self._keys[kg] = encode_key(kg)
        return kb

    def earliest(self) -> int | None:
        """The earliest timer's timestamp (cached until timers fire)."""
        if not self._known:
            self.next_timer = self.backend.timers.next_timestamp(self.domain)
            self._known = True
        return self.next_timer

    def pop_due(self, upto: int) -> list[int]:
        """The key groups whose timers are due at ``upto`` (their timers removed), in order."""
        due = self.backend.timers.pop_due(self.domain, upto)
        self._known = False
        return sorted({t.key_group for t in due})

    def forget(self) -> None:
        """Look the earliest timer up again (after a restore)."""
        self._known = False
