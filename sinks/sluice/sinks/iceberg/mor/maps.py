"""Rewrite maps: where the rewrite that folds deletes moved each live row, so that positions the index still
holds for a rewritten file are translated when they are used.

A rewrite writes one map before its commit: Parquet under ``_sluice_maps/`` in the table's location, columns
``old_file``, ``old_pos``, ``new_file``, ``new_pos`` (file ids, :func:`~sluice.sinks.iceberg.mor.positions.file_id`)
sorted by old file and position, its footer naming the old and the new file ids. The writers' index is never
rewritten: a key's entry that points into a file a rewrite replaced is translated by the committer when the
key next changes (and then replaced by the key's new position), through as many rewrites as replaced the file
since. A map counts only if its rewrite committed: its new files are live, or were themselves replaced by a
rewrite whose map counts (a map of a rewrite that never landed names new files that never were live, and is
deleted when found).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

__all__ = ["MAPS_DIR", "RewriteMaps", "write_map"]

log = logging.getLogger("sluice.sinks.iceberg")

MAPS_DIR = "_sluice_maps"
_OLD, _NEW = b"sluice.old-files", b"sluice.new-files"
#: rewrites a position may have passed through before it is refused as unresolvable
_MAX_HOPS = 64


def write_map(
    fs: pafs.FileSystem,
    root: str,
    old_file: np.ndarray[Any, Any],
    old_pos: np.ndarray[Any, Any],
    new_file: np.ndarray[Any, Any],
    new_pos: np.ndarray[Any, Any],
) -> str:
    """Write a rewrite's map; returns its path relative to the table's location."""
    order = np.lexsort((old_pos, old_file))
    table = pa.table(
        {
            "old_file": pa.array(old_file[order], pa.int64()),
            "old_pos": pa.array(old_pos[order], pa.int64()),
            "new_file": pa.array(new_file[order], pa.int64()),
            "new_pos": pa.array(new_pos[order], pa.int64()),
        }
    )
    meta = {_OLD: json.dumps(sorted(set(old_file.tolist()))).encode(), _NEW: json.dumps(sorted(set(new_file.tolist()))).encode()}
    table = table.replace_schema_metadata(meta)
    rel = f"{MAPS_DIR}/map-{uuid.uuid4().hex}.parquet"
    if isinstance(fs, pafs.LocalFileSystem):
        fs.create_dir(f"{root}/{MAPS_DIR}", recursive=True)
    with fs.open_output_stream(f"{root}/{rel}") as out:
        pq.write_table(table, out, compression="zstd")
    return rel


class RewriteMaps:
    """The maps of a table's rewrites, read from storage once and kept (small: their footers), each map's
    rows read when a translation first needs them."""

    def __init__(self, fs: pafs.FileSystem, root: str) -> None:
        self.fs, self.root = fs, root
        self._old: dict[int, list[str]] = {}  # old file id -> maps that moved its rows
        self._new: dict[str, set[int]] = {}
        self._rows: dict[str, pa.Table] = {}
        self.reload()

    def reload(self) -> None:
        """Read every map's footer again (after a rewrite committed)."""
        self._old.clear()
        self._new.clear()
        selector = pafs.FileSelector(f"{self.root}/{MAPS_DIR}", allow_not_found=True)
        for info in self.fs.get_file_info(selector):
            if info.type == pafs.FileType.File and info.base_name.endswith(".parquet"):
                self.add(info.path[len(self.root) :].lstrip("/"))

    def add(self, rel: str) -> None:
        """Know the map ``rel`` (a rewrite just committed it)."""
        meta = pq.read_schema(f"{self.root}/{rel}", filesystem=self.fs).metadata or {}
        for fid in json.loads(meta.get(_OLD, b"[]")):
            self._old.setdefault(int(fid), []).append(rel)
        self._new[rel] = {int(f) for f in json.loads(meta.get(_NEW, b"[]"))}

    def paths(self) -> list[str]:
        return sorted(self._new)

    def valid(self, rel: str, live: Callable[[int], bool], depth: int = 0) -> bool:
        """Whether map ``rel``'s rewrite committed: each of its new files is live, or replaced by a rewrite
        whose map is valid."""
        if depth > _MAX_HOPS:
            return False
        for fid in self._new.get(rel, ()):
            if live(fid):
                continue
            if not any(self.valid(m, live, depth + 1) for m in self._old.get(fid, ()) if m != rel):
                return False
        return True

    def uncommitted(self, live: Callable[[int], bool]) -> list[str]:
        """Maps whose rewrite never landed: every old file still live, no new file live nor replaced."""
        return [
            rel
            for rel, new in self._new.items()
            if not any(live(f) for f in new)
            and not any(f in self._old for f in new)
            and all(live(f) for f, maps in self._old.items() if rel in maps)
        ]

    def _rows_of(self, rel: str) -> pa.Table:
        if rel not in self._rows:
            self._rows[rel] = pq.read_table(f"{self.root}/{rel}", filesystem=self.fs)
        return self._rows[rel]

    def translate(
        self, files: np.ndarray[Any, Any], positions: np.ndarray[Any, Any], live: Callable[[int], bool]
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], list[int]]:
        """Positions in files that are no longer live, followed through the maps to their rows' live
        positions; returns the files, the positions and the ids found in no valid map (unresolvable)."""
        files, positions = files.copy(), positions.copy()
        lost: list[int] = []
        for _ in range(_MAX_HOPS):
            stale = sorted({int(f) for f in np.unique(files) if not live(int(f))} - set(lost))
            if not stale:
                break
            for fid in stale:
                maps = [m for m in self._old.get(fid, []) if self.valid(m, live)]
                if not maps:
                    lost.append(fid)
                    continue
                rows = self._rows_of(maps[0])
                old_file = rows.column("old_file").to_numpy()
                lo, hi = np.searchsorted(old_file, fid, "left"), np.searchsorted(old_file, fid, "right")
                old_pos = rows.column("old_pos").to_numpy()[lo:hi]
                at = np.flatnonzero(files == fid)
                where = np.searchsorted(old_pos, positions[at])
                inside = where < len(old_pos)
                found = np.zeros(len(at), bool)
                found[inside] = old_pos[where[inside]] == positions[at][inside]
                if not found.all():
                    lost.append(fid)  # the index named a row the rewrite did not carry (it was deleted)
                    continue
                files[at] = rows.column("new_file").to_numpy()[lo:hi][where]
                positions[at] = rows.column("new_pos").to_numpy()[lo:hi][where]
        return files, positions, lost

    def remove(self, rel: str) -> None:
        """Delete map ``rel`` (its rewrite never landed)."""
        try:
            self.fs.delete_file(f"{self.root}/{rel}")
        except FileNotFoundError:
            pass
        self._new.pop(rel, None)
        for maps in self._old.values():
            if rel in maps:
                maps.remove(rel)
        self._rows.pop(rel, None)
