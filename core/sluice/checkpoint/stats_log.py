"""The job's checkpoint statistics on storage: the newest ``history_size`` records, in rolled segments.

``<job-dir>/_stats/<seq>.jsonl`` holds up to :data:`SEGMENT_RECORDS` records (one JSON object a line, in the
order checkpoints completed or failed). The coordinator rewrites the newest segment whole after each
checkpoint (atomically: a local write and rename, an S3 put; it holds the segment's lines, so nothing is
read back), starts a new one when it is full, and deletes the oldest segments once the others hold
``history_size`` records (so between ``history_size`` and ``history_size + SEGMENT_RECORDS - 1`` are
kept). So a checkpoint writes at most one segment and deletes at most one, however long
the job has run, and a restore reads only the newest segments (:meth:`CheckpointStatsLog.newest`).

Folders written by earlier versions of sluice kept every record in ``<job-dir>/_stats.jsonl``, appended to forever:
it is read as the history while no segment exists, and the first coordinator that records a checkpoint
moves its newest ``history_size`` records into the first segment and deletes it.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from sluice.checkpoint.storage import CheckpointStorage

__all__ = ["DEFAULT_HISTORY_SIZE", "LEGACY_STATS", "SEGMENT_RECORDS", "STATS_DIR", "CheckpointStatsLog"]

log = logging.getLogger("sluice.checkpoint")

#: the folder of the stats segments, in the job's folder
STATS_DIR = "_stats"
#: the single, ever-growing stats file of folders written before segments
LEGACY_STATS = "_stats.jsonl"
#: records a segment holds at most (fewer if ``history_size`` is smaller)
SEGMENT_RECORDS = 20
#: checkpoints whose statistics are kept unless ``CheckpointConfig.history_size`` says otherwise
DEFAULT_HISTORY_SIZE = 100

_SEGMENT = re.compile(r"^(\d{10})\.jsonl$")


class CheckpointStatsLog:
    """The stats records of one job on its checkpoint storage.

    A coordinator writes through one instance (it keeps the newest segment's lines); readers (a restore,
    ``sluice checkpoints``) may use any instance.

    Args:
        storage: the job's checkpoint storage.
        history_size: records kept at least (fewer than one segment more).
    """

    def __init__(self, storage: CheckpointStorage, history_size: int = DEFAULT_HISTORY_SIZE) -> None:
        self.storage = storage
        self.history_size = history_size
        self.per_segment = max(1, min(SEGMENT_RECORDS, history_size))
        #: segments on storage, oldest first (the writer's view, once it has looked)
        self._segments: list[int] | None = None
        #: the lines of the newest segment, as written
        self._lines: list[str] = []

    # -- paths -----------------------------------------------------------------------------------------
    def _folder(self) -> str:
        return f"{self.storage.job_dir()}/{STATS_DIR}"

    def _path(self, seq: int) -> str:
        return f"{self._folder()}/{seq:010d}.jsonl"

    # -- reading ---------------------------------------------------------------------------------------
    def segments(self) -> list[int]:
        """The sequence numbers of the segments on storage, oldest first (one listing)."""
        s = self.storage
        names = s.retrying("list stats", s.list_dirs, self._folder())
        return sorted(int(m.group(1)) for n in names if (m := _SEGMENT.match(n)))

    def read(self) -> list[dict[str, Any]]:
        """Every record kept, oldest first (the old single file's while no segment exists)."""
        seqs = self.segments()
        if not seqs:
            return self._legacy() or []
        return [r for seq in seqs for r in self._records(self._path(seq))]

    def newest(self) -> list[dict[str, Any]]:
        """The newest records, oldest first: the newest segments back to one that holds a completed
        checkpoint (usually the newest alone), enough to tell the newest completed checkpoint and the
        highest id recorded without reading the whole history."""
        seqs = self.segments()
        if not seqs:
            return self._legacy() or []
        out: list[dict[str, Any]] = []
        for seq in reversed(seqs):
            out[:0] = self._records(self._path(seq))
            if any(r.get("status") == "completed" for r in out):
                break
        return out

    def _legacy(self) -> list[dict[str, Any]] | None:
        try:
            return self._records(f"{self.storage.job_dir()}/{LEGACY_STATS}", missing_ok=False)
        except FileNotFoundError:
            return None

    def _records(self, path: str, missing_ok: bool = True) -> list[dict[str, Any]]:
        """The records of one file. A line that is not JSON (an append cut short) is skipped."""
        s = self.storage
        try:
            raw = s.retrying("read stats", s.read_file, path)
        except FileNotFoundError:
            if missing_ok:  # trimmed since it was listed
                return []
            raise
        out = []
        for line in raw.decode(errors="replace").splitlines():
            try:
                row = json.loads(line) if line.strip() else None
            except ValueError:
                row = None
                log.warning("%s: skipping a line that is not JSON: %.80r", path, line)
            if isinstance(row, dict) and "checkpoint_id" in row:
                out.append(row)
        return out

    # -- writing ---------------------------------------------------------------------------------------
    def record(self, stats: dict[str, Any]) -> None:
        """Add one checkpoint's record: the newest segment is rewritten (or a new one begun, and the
        oldest beyond ``history_size`` deleted)."""
        segments = self._open()
        if not segments or len(self._lines) >= self.per_segment:
            segments.append(segments[-1] + 1 if segments else 0)
            self._lines = []
        self._lines.append(json.dumps(stats, sort_keys=True))
        self._write(segments[-1])
        self._trim(segments)

    def _write(self, seq: int) -> None:
        s = self.storage
        data = ("\n".join(self._lines) + "\n").encode()
        s.retrying("record stats", s.replace, self._path(seq), data)

    def _open(self) -> list[int]:
        """The writer's view of the segments: listed once, the old single file moved into the first."""
        if self._segments is not None:
            return self._segments
        seqs = self.segments()
        legacy = self._legacy()
        if legacy is not None:
            if not seqs:  # its newest records become the first segment (then it is deleted)
                self._lines = [json.dumps(r, sort_keys=True) for r in legacy[-self.history_size :]]
                if self._lines:
                    seqs = [0]
                    self._write(0)
            self._delete(f"{self.storage.job_dir()}/{LEGACY_STATS}")
        elif seqs:
            self._lines = [json.dumps(r, sort_keys=True) for r in self._records(self._path(seqs[-1]))]
        self._segments = seqs
        return seqs

    def _trim(self, segments: list[int]) -> None:
        """Delete the oldest segment while the ones after it (full, but the newest) hold ``history_size``
        records: between ``history_size`` and ``history_size + per_segment - 1`` are kept."""
        while len(segments) > 1 and len(self._lines) + (len(segments) - 2) * self.per_segment >= self.history_size:
            if not self._delete(self._path(segments[0])):
                return
            segments.pop(0)

    def _delete(self, path: str) -> bool:
        """Delete one file; a failure is logged (the next new segment tries again), never raised."""
        s = self.storage
        try:
            s.retrying("delete stats", s.delete_file, path)
        except Exception as exc:
            log.warning("could not delete %s: %s: %s", path, type(exc).__name__, exc)
            return False
        return True
