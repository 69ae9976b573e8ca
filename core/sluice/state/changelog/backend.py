"""The changelog keyed backend: checkpoints persist only the changes since the last one, a full
materialization is written in the background on an interval (Flink's ``ChangelogKeyedStateBackend`` and
``PeriodicMaterializationManager``; Spark's RocksDB changelog checkpointing).

* **Checkpoint**, synchronous part: seal the changes recorded since the last checkpoint into segment ``s``
  (RocksDB: swap a dict; hashmap: read the changed entries). Asynchronous part: encode the segment once and
  upload it; the handle is the base materialization plus every segment from the base's ``from_seq`` on.
  Segments a completed checkpoint confirmed are referenced (placeholders); segments sealed after the last
  confirmed checkpoint are uploaded again by each checkpoint until one completes, so no checkpoint relies
  on an upload an aborted one made (FLINK-25395).
* **Materialization**, every ``changelog_materialize_interval`` (checked at each checkpoint and by
  :meth:`~ChangelogKeyedStateBackend.materialize_if_due`): the wrapped backend's own snapshot, its
  synchronous part on the task's thread (RocksDB: flush + native checkpoint; hashmap: freeze), its
  upload on a background thread (RocksDB: incremental, reusing the last confirmed materialization's SST
  files; hashmap: canonical files). It first seals the open segment and covers every change up to there,
  so checkpoints that reference it reference only the segments sealed after it. The first checkpoint that references it
  uploads nothing for it but lists its files as new; it becomes the confirmed base when a checkpoint
  referencing it completes, and is dropped (and redone) if such a checkpoint is aborted.
* **Restore** (:mod:`sluice.state.changelog.restore`): materializations + segments by key group; then a
  materialization of the restored state starts at once and the first checkpoint waits for it, so handles
  never reference an old job's files for long.

Old segments and materializations are shared files: the shared-state registry deletes them once no retained
checkpoint references them.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from sluice.state.changelog.capture import capture_for
from sluice.state.changelog.format import FORMAT_VERSION, ChangelogPaths, SegmentRef, write_segment
from sluice.state.config import StateBackendConfig
from sluice.state.delegating import DelegatingKeyedStateBackend
from sluice.state.meta import StateMeta
from sluice.state.spi import Handle, KeyedStateBackend, StateSnapshot
from sluice.state.transfer import new_mark, upload_file

__all__ = ["ChangelogKeyedStateBackend"]

log = logging.getLogger("sluice.state")

_POOL_LOCK = threading.Lock()
_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    """The background threads that upload materializations (shared by every changelog backend)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="sluice-materialize")
        return _POOL


@dataclass(eq=False)
class _Base:
    """A materialization: the wrapped backend's full snapshot, replayed from segment ``from_seq`` on."""

    id: str
    from_seq: int
    future: Future[Handle] | None = None  # None: the empty state a fresh backend starts from
    mid: int = 0
    mark: int = 0  # local recovery: uploads from this mark on are this materialization's
    first_ref: int | None = None  # the checkpoint that lists its files as new

    def handle(self) -> Handle | None:
        return None if self.future is None else self.future.result()

    def ready(self) -> bool:
        return self.future is None or (self.future.done() and self.future.exception() is None)

    def failed(self) -> bool:
        return self.future is not None and self.future.done() and self.future.exception() is not None


@dataclass(eq=False)
class _Segment:
    """Changes sealed at one checkpoint, kept locally until a completed checkpoint covers them."""

    seq: int
    changes: Any
    nonempty: bool
    lock: threading.Lock = field(default_factory=threading.Lock)
    encoded: bool = False
    path: str | None = None
    kgs: tuple[int, ...] = ()


@dataclass(eq=False)
class _Pending:
    base: _Base
    new_base: bool
    seq: int
    local: list[_Segment]
    segments: list[SegmentRef] = field(default_factory=list)


class ChangelogKeyedStateBackend(DelegatingKeyedStateBackend):
    """Changelog checkpoints over a hashmap or RocksDB keyed backend (``delegate``), which holds the state."""

    def __init__(self, delegate: KeyedStateBackend, config: StateBackendConfig) -> None:
        super().__init__(delegate)
        #: records the wrapped backend's changes between checkpoints
        self.capture = capture_for(delegate)
        self._interval_ms = max(1, round(config.changelog_materialize_interval * 1000))
        self._token = uuid.uuid4().hex[:12]
        self.paths = delegate.paths = ChangelogPaths(delegate.paths.owner, self._token)
        base = config.local_dir or os.path.join(tempfile.gettempdir(), "sluice-changelog")
        os.makedirs(base, exist_ok=True)
        self._workdir = tempfile.mkdtemp(prefix="changelog-", dir=base)
        self._lock = threading.Lock()
        self._seq = 1  # the open segment
        self._local: list[_Segment] = []  # sealed, not yet covered by a completed checkpoint
        self._retired: list[_Segment] = []  # covered, their files deleted once no pending checkpoint uploads them
        self._base: _Base | None = _Base("empty", 1)  # the confirmed base; None after a restore
        self._confirmed: list[SegmentRef] = []  # uploads a completed checkpoint confirmed, from the base on
        self._mat: _Base | None = None  # a materialization not confirmed yet
        self._pending: dict[int, _Pending] = {}
        self._mid = 0
        self._last_start = self.clock()

    # -- materialization ------------------------------------------------------------------------------
    def materialize_if_due(self) -> None:
        self._reap_failed()
        if self._mat is None and (self._base is None or self.clock() - self._last_start >= self._interval_ms):
            self._start_materialization()

    def materialize(self) -> Future[Handle] | None:
        """Start a materialization now unless one is under way (or nothing changed since the base);
        the materialization to wait for, if any."""
        self._reap_failed()
        if self._mat is None:
            self._start_materialization()
        return None if self._mat is None else self._mat.future

    def retention_floor(self) -> int | None:
        """The local-recovery mark from which uploads belong to a materialization not confirmed yet (their
        local copies are kept)."""
        mat = self._mat
        return None if mat is None else mat.mark

    def _changed_since_base(self) -> bool:
        return (
            self._base is None
            or bool(self._confirmed)
            or any(s.nonempty for s in self._local)
            or self.capture.has_changes()
        )

    def _start_materialization(self) -> None:
        self._last_start = self.clock()
        if not self._changed_since_base():
            return
        self._mid += 1
        mid = self._mid
        self._seal()  # the materialization covers every change sealed up to here
        snap = self.delegate.snapshot(mid)  # the synchronous part, here on the task's thread
        mat = _Base(f"{self._token}-m{mid}", self._seq, mid=mid, mark=new_mark())
        mat.future = _pool().submit(self._materialize, snap, mid)
        self._mat = mat

    def _materialize(self, snap: StateSnapshot, mid: int) -> Handle:
        handle = snap.run()
        groups = handle.pop("groups", None)
        if groups:  # the hashmap's inline canonical groups become shared files
            files = {}
            for kg, blob in groups.items():
                local = os.path.join(self._workdir, f"m{mid}-kg{kg}.arrows")
                with open(local, "wb") as f:
                    f.write(blob)
                try:
                    files[kg] = upload_file(self.transfer, local, self.paths.shared(f"{self._token}-m{mid}-kg{kg}.arrows")).to_plain()
                finally:
                    os.unlink(local)
            handle["files"] = files
        return handle

    def _reap_failed(self) -> None:
        mat = self._mat
        if mat is not None and mat.failed():
            log.warning("materialization %s of keyed state failed (%s); it is retried", mat.id, mat.future.exception())  # type: ignore[union-attr]
            self._drop_materialization()

    def _drop_materialization(self) -> None:
        mat, self._mat = self._mat, None
        if mat is not None:
            self.delegate.notify_checkpoint_aborted(mat.mid)
            self._last_start = self.clock() - self._interval_ms  # due again at once

    # -- checkpoints ----------------------------------------------------------------------------------
    def snapshot(self, checkpoint_id: int, savepoint: bool = False) -> StateSnapshot:
        if savepoint:
            return self.delegate.snapshot(checkpoint_id, savepoint=True)
        self.materialize_if_due()
        seg = self._seal()
        with self._lock:
            mat = self._mat
            if mat is not None and (self._base is None or mat.first_ref is not None or mat.ready()):
                # a materialization that is ready, already referenced (optimistically: if the checkpoint
                # that lists its files as new fails, the registry declines this one), or the only base
                base, new = mat, mat.first_ref is None
            else:
                assert self._base is not None
                base, new = self._base, False
            if new:
                base.first_ref = checkpoint_id
            confirmed = [s for s in self._confirmed if s.seq >= base.from_seq]
            local = [s for s in self._local if s.seq >= base.from_seq]
            pending = self._pending[checkpoint_id] = _Pending(base, new, seg.seq, local)
        return _ChangelogSnapshot(self, checkpoint_id, pending, confirmed, self.delegate.state_meta())

    def _seal(self) -> _Segment:
        changes, nonempty = self.capture.seal()
        seg = _Segment(self._seq, changes, nonempty)
        self._seq += 1
        with self._lock:
            self._local.append(seg)
        return seg

    def upload_segment(self, seg: _Segment, checkpoint_id: int) -> SegmentRef | None:
        """Encode a sealed segment (once) and upload it for ``checkpoint_id``; None if it is empty."""
        with seg.lock:
            if not seg.encoded:
                if seg.nonempty:
                    rows = self.capture.rows(seg.changes)
                    seg.path = os.path.join(self._workdir, f"s{seg.seq}.arrows")
                    write_segment(seg.path, rows)
                    seg.kgs = tuple(sorted(set(rows.column("kg").to_pylist())))
                seg.changes, seg.encoded = None, True
        if seg.path is None:
            return None
        remote = self.paths.shared(f"{self._token}-s{seg.seq}-c{checkpoint_id}.arrows")
        return SegmentRef(upload_file(self.transfer, seg.path, remote), seg.seq, seg.kgs)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        confirm: int | None = None
        with self._lock:
            p = self._pending.pop(checkpoint_id, None)
            for cid in [c for c in self._pending if c < checkpoint_id]:
                del self._pending[cid]
            if p is not None:
                mat = self._mat
                if p.base is mat:
                    self._base, self._mat, confirm = mat, None, mat.mid
                elif mat is not None and mat.first_ref is not None and mat.first_ref < checkpoint_id:
                    self._mat = None  # its first checkpoint is gone and nothing later confirmed it
                    self.delegate.notify_checkpoint_aborted(mat.mid)
                self._base = p.base
                self._confirmed = [s for s in p.segments if s.seq >= p.base.from_seq]
                self._retire(lambda s: s.seq <= p.seq or s.seq < p.base.from_seq)
            self._delete_retired()
        if confirm is not None:
            self.delegate.notify_checkpoint_complete(confirm)  # its SST files may be reused

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        with self._lock:
            p = self._pending.pop(checkpoint_id, None)
            if p is not None and p.base is self._mat:
                # its files may be deleted with the aborted checkpoint: materialize again
                self._drop_materialization()
            self._delete_retired()

    def _retire(self, covered: Callable[[_Segment], bool]) -> None:
        keep: list[_Segment] = []
        for s in self._local:
            (self._retired if covered(s) else keep).append(s)
        self._local = keep

    def _delete_retired(self) -> None:
        in_use = {id(s) for p in self._pending.values() for s in p.local}
        still: list[_Segment] = []
        for s in self._retired:
            if id(s) in in_use:
                still.append(s)
            elif s.path is not None:
                os.unlink(s.path)
        self._retired = still

    # -- restore and disposal -------------------------------------------------------------------------
    def restore(self, handles: Sequence[Handle]) -> None:
        self._await_materialization()
        self.capture.pause()
        try:
            self.delegate.restore(handles)
        finally:
            self.capture.resume()
        with self._lock:
            self._retired.extend(self._local)
            self._local, self._confirmed, self._pending = [], [], {}
            self._delete_retired()
            self._base = None if handles else _Base("empty", self._seq)
        if handles:
            self._start_materialization()

    def _await_materialization(self) -> None:
        mat, self._mat = self._mat, None
        if mat is not None and mat.future is not None:
            try:
                mat.future.result()
            except Exception as exc:
                log.debug("materialization %s ended with %s", mat.id, exc)
            self.delegate.notify_checkpoint_aborted(mat.mid)

    def dispose(self) -> None:
        try:
            self._await_materialization()
        finally:
            try:
                self.delegate.dispose()
            finally:
                shutil.rmtree(self._workdir, ignore_errors=True)


class _ChangelogSnapshot(StateSnapshot):
    def __init__(
        self,
        backend: ChangelogKeyedStateBackend,
        checkpoint_id: int,
        pending: _Pending,
        confirmed: list[SegmentRef],
        meta: dict[str, StateMeta],
    ) -> None:
        self._be, self._cid, self._pending, self._confirmed, self._meta = backend, checkpoint_id, pending, confirmed, meta

    def run(self) -> Handle:
        p, be = self._pending, self._be
        base = p.base.handle()  # waits for a materialization under way
        uploaded = [ref for seg in p.local if (ref := be.upload_segment(seg, self._cid)) is not None]
        p.segments = [*self._confirmed, *uploaded]
        kgs = be.key_groups
        return {
            "backend": be.capture.backend,
            "format": "changelog",
            "version": FORMAT_VERSION,
            "checkpoint_id": self._cid,
            "key_groups": [kgs.start, kgs.end],
            "states": {n: m.to_plain() for n, m in self._meta.items()},
            "base": None if base is None else {"handle": base, "confirmed": not p.new_base, "id": p.base.id},
            "segments": [s.to_plain(True) for s in self._confirmed] + [s.to_plain(False) for s in uploaded],
        }
