"""The shared-state registry: which checkpoint files several checkpoints share, and when one may go.

Pure bookkeeping (no I/O), kept by the coordinator's completed-checkpoint store, after Flink's
``SharedStateRegistryImpl``. An incremental RocksDB checkpoint references SST files under ``shared/``: the
ones it uploaded and, as *placeholders*, ones an earlier completed checkpoint uploaded; a changelog
checkpoint references its materialization's files and its segments of changes the same way. When a checkpoint
completes, :meth:`SharedStateRegistry.register_checkpoint` records every file it references with the
checkpoint as its last user; once older checkpoints are subsumed, :meth:`~SharedStateRegistry.unregister_unused`
returns the files whose last user is older than the lowest retained checkpoint: no retained checkpoint uses
them, so they are deleted then, and never earlier.

Two guards after FLINK-25395: a placeholder must name a registered file (an upload that a completed
checkpoint confirmed), else the checkpoint is declined rather than completed over a file that may be
gone; and the uploads of a checkpoint that never completes are returned by
:meth:`~SharedStateRegistry.discard_unregistered` only if no completed checkpoint registered them. On restore
the registry is rebuilt from the retained checkpoints' handles (:meth:`~SharedStateRegistry.rebuild`), and
files under ``shared/`` that none of them references are :meth:`~SharedStateRegistry.orphans`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sluice.errors import CheckpointError, CheckpointFailureReason

__all__ = ["SharedRef", "SharedStateRegistry", "shared_refs"]


@dataclass(frozen=True)
class SharedRef:
    """A shared file a checkpoint references: its path, and whether it reuses an earlier upload."""

    path: str
    placeholder: bool = False


@dataclass
class _Entry:
    created_by: int
    last_used: int


def shared_refs(handles: Iterable[Any]) -> list[SharedRef]:
    """The shared files the keyed state handles of one checkpoint reference (other data is ignored): a
    native RocksDB handle's SST files, and every file of a changelog handle (its materialization and
    segments)."""
    from sluice.state.handles import handle_files

    out: list[SharedRef] = []
    for h in handles:
        if isinstance(h, dict) and h.get("format") == "native":
            for ref in (h.get("shared") or {}).values():
                out.append(SharedRef(str(ref["path"]), bool(ref.get("placeholder"))))
        elif isinstance(h, dict) and h.get("format") == "changelog":
            out.extend(SharedRef(ref.path, placeholder) for ref, placeholder in handle_files(h))
    return out


class SharedStateRegistry:
    """Reference counts of shared checkpoint files, by the last checkpoint that uses each."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}

    def register_checkpoint(self, checkpoint_id: int, refs: Iterable[SharedRef], *, restored: bool = False) -> None:
        """Record the shared files of a checkpoint that completed (before older ones are subsumed).

        Args:
            checkpoint_id: the completed checkpoint.
            refs: the shared files its handles reference.
            restored: the checkpoint was retained before a restore (its placeholders may name files whose
                first user is no longer retained).

        Raises:
            CheckpointError: a placeholder names a file no completed checkpoint registered (its upload was
                never confirmed, or it was deleted); nothing was recorded.
        """
        refs = list(refs)
        if not restored:
            self.validate(checkpoint_id, refs)
        for r in refs:
            e = self._entries.get(r.path)
            if e is None:
                self._entries[r.path] = _Entry(checkpoint_id, checkpoint_id)
            elif checkpoint_id > e.last_used:
                e.last_used = checkpoint_id

    def validate(self, checkpoint_id: int, refs: Iterable[SharedRef]) -> None:
        """Refuse a checkpoint whose placeholders name files no retained checkpoint holds; call it before
        the checkpoint's metadata is written, so a declined checkpoint never looks completed.

        Raises:
            CheckpointError: (``DECLINED``) naming one such file.
        """
        unknown = sorted({r.path for r in refs if r.placeholder and r.path not in self._entries})
        if unknown:
            raise CheckpointError(
                CheckpointFailureReason.DECLINED,
                f"it reuses {len(unknown)} shared state file(s) no retained checkpoint holds (e.g. {unknown[0]}); "
                "the next checkpoint uploads them again",
                checkpoint_id,
            )

    def unregister_unused(self, lowest_retained: int) -> list[str]:
        """Forget and return the files no checkpoint from ``lowest_retained`` on uses: delete them now."""
        gone = sorted(p for p, e in self._entries.items() if e.last_used < lowest_retained)
        for p in gone:
            del self._entries[p]
        return gone

    def discard_unregistered(self, refs: Iterable[SharedRef]) -> list[str]:
        """Of the files a checkpoint that will not complete uploaded, the ones to delete (not placeholders,
        not registered by a completed checkpoint)."""
        return sorted({r.path for r in refs if not r.placeholder and r.path not in self._entries})

    def is_registered(self, path: str) -> bool:
        """Whether a completed, retained checkpoint references ``path``."""
        return path in self._entries

    def referenced(self) -> set[str]:
        """Every file a retained checkpoint references."""
        return set(self._entries)

    def last_used(self, path: str) -> int | None:
        """The last checkpoint that references ``path``, or None."""
        e = self._entries.get(path)
        return None if e is None else e.last_used

    def orphans(self, listed: Iterable[str]) -> list[str]:
        """Of the files found under ``shared/`` (``listed``), the ones no retained checkpoint references:
        uploads of checkpoints that never completed before a crash. Call it only while no checkpoint is
        pending (on restore)."""
        return sorted(p for p in set(listed) if p not in self._entries)

    @classmethod
    def rebuild(cls, retained: Sequence[tuple[int, Iterable[SharedRef]]]) -> SharedStateRegistry:
        """The registry of a job restarting with the retained checkpoints ``(id, refs)``."""
        registry = cls()
        for checkpoint_id, refs in sorted(retained, key=lambda r: r[0]):
            registry.register_checkpoint(checkpoint_id, refs, restored=True)
        return registry
