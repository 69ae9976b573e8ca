"""Restoring changelog handles: the materializations through the backend's own restore, then each old
subtask's segments replayed in order, only the rows of key groups this subtask owns (so rescaling works).

A backend with changelog off restores changelog handles the same way (switching changelog off needs no
savepoint); a changelog backend restores plain handles through its backend (switching it on).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice.errors import RestoreError
from sluice.state.canonical import SCHEMA, canonical_groups, handle_range, merged_meta
from sluice.state.changelog.format import (
    FORMAT_VERSION,
    HEAP_SEGMENT,
    OP_ADD,
    OP_CLEAR,
    ROCKSDB_SEGMENT,
    SegmentRef,
    read_segment,
)
from sluice.state.keygroups import KeyGroupRange
from sluice.state.meta import TIMER_STATES
from sluice.state.spi import Handle, KeyedStateBackend
from sluice.state.transfer import download_verified

__all__ = ["restore_changelog"]


def _check(handle: Handle, backend: str) -> None:
    if handle.get("version") != FORMAT_VERSION:
        raise RestoreError(f"changelog keyed state version {handle.get('version')} is not readable by this sluice")
    if handle.get("backend") != backend:
        raise RestoreError(
            f"keyed state written by the {handle.get('backend')} state backend with changelog checkpoints cannot be "
            f"restored by the {backend} backend: switch backends through a savepoint"
        )


def _segments(be: KeyedStateBackend, handle: Handle, schema: pa.Schema) -> Iterator[pa.Table]:
    """The rows of this subtask's key groups in each segment of ``handle``, in order."""
    theirs = handle_range(handle)
    lo, hi = max(theirs.start, be.key_groups.start), min(theirs.end, be.key_groups.end)
    refs = sorted((SegmentRef.from_plain(s) for s in handle.get("segments") or []), key=lambda r: r.seq)
    for ref in refs:
        if not any(lo <= kg < hi for kg in ref.kgs):
            continue
        fd, tmp = tempfile.mkstemp(prefix="sluice-changelog-")
        os.close(fd)
        try:
            download_verified(be.transfer, ref.file, tmp)
            rows = read_segment(tmp, schema)
        finally:
            os.unlink(tmp)
        kg = rows.column("kg")
        yield rows.filter(pc.and_(pc.greater_equal(kg, lo), pc.less(kg, hi)))


def restore_changelog(be: KeyedStateBackend, handles: Sequence[Handle]) -> None:
    """Load this subtask's key groups out of changelog (and plain) handles into ``be`` (a fresh hashmap or
    RocksDB keyed backend)."""
    name = be.backend_name
    logs = [h for h in handles if h.get("format") == "changelog"]
    for h in logs:
        _check(h, name)
    plain = [h for h in handles if h.get("format") != "changelog"]
    ours = be.key_groups
    overlapping = [h for h in logs if _overlaps(handle_range(h), ours)]
    bases = plain + [{**h["base"]["handle"], "states": h["states"]} for h in overlapping if h.get("base")]
    meta = merged_meta([*plain, *logs])
    if name == "hashmap":
        native = next((h for h in bases if h.get("format") != "canonical"), None)
        if native is not None:
            raise RestoreError(
                f"keyed state written by the {native.get('backend', 'unknown')} state backend in its native format "
                "cannot be restored by the hashmap backend: restore it with that backend, or switch backends "
                "through a savepoint"
            )
        groups: dict[int, pa.Table] = {}
        for kg, rows in canonical_groups(bases, ours, be.transfer):
            groups[kg] = pa.concat_tables([groups[kg], rows]) if kg in groups else rows
        for h in overlapping:
            for rows in _segments(be, h, HEAP_SEGMENT):
                for kg, part in _by_key_group(rows):
                    groups[kg] = _apply(groups.get(kg), part)
        be.restore_groups(meta, sorted(groups.items()))  # type: ignore[attr-defined]
        return
    be.restore(bases)
    be.restored_meta.update(meta)  # type: ignore[attr-defined]
    for h in overlapping:
        for rows in _segments(be, h, ROCKSDB_SEGMENT):
            be.write_many(zip(rows.column("key").to_pylist(), rows.column("value").to_pylist(), strict=True))  # type: ignore[attr-defined]
    be.timers.forget()  # type: ignore[attr-defined]


def _overlaps(a: KeyGroupRange, b: KeyGroupRange) -> bool:
    return max(a.start, b.start) < min(a.end, b.end)


def _by_key_group(rows: pa.Table) -> Iterator[tuple[int, pa.Table]]:
    """Rows sorted by key group, split by key group."""
    kgs = rows.column("kg").to_numpy()
    if not len(kgs):
        return
    starts = np.flatnonzero(np.diff(kgs, prepend=-1))
    ends = [*starts[1:], len(kgs)]
    for start, end in zip(starts.tolist(), ends, strict=True):
        yield int(kgs[start]), rows.slice(start, end - start)


def _identity(state: str, key: bytes, namespace: bytes, value: bytes | None) -> tuple[Any, ...]:
    # an entry is cleared as a whole; a timer one by one (its timestamp is its value)
    return (state, key, namespace, value if state in TIMER_STATES else None)


def _apply(base: pa.Table | None, segment: pa.Table) -> pa.Table:
    """One key group's canonical rows after one segment: cleared entries removed, added rows appended."""
    ops = segment.column("op")
    cleared = segment.filter(pc.equal(ops, OP_CLEAR))
    added = segment.filter(pc.equal(ops, OP_ADD)).select(SCHEMA.names)
    added = pa.table([added.column(n).cast(f.type) for n, f in zip(SCHEMA.names, SCHEMA, strict=True)], schema=SCHEMA)
    if base is None or not len(base):
        return added
    if len(cleared):
        gone = {
            _identity(*row)
            for row in zip(*(cleared.column(c).to_pylist() for c in ("state", "key", "namespace", "value")), strict=True)
        }
        candidates = np.flatnonzero(pc.is_in(base.column("key"), value_set=cleared.column("key")).to_numpy(zero_copy_only=False))
        if len(candidates):
            sub = base.take(pa.array(candidates))
            cols = (sub.column(c).to_pylist() for c in ("state", "key", "namespace", "value"))
            drop = [int(i) for i, row in zip(candidates, zip(*cols, strict=True), strict=True) if _identity(*row) in gone]
            if drop:
                keep = np.ones(len(base), dtype=bool)
                keep[drop] = False
                base = base.filter(pa.array(keep))
    return pa.concat_tables([base, added]) if len(added) else base
