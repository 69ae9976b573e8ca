"""The shared-state registry of an attempt, rebuilt from the checkpoints the job keeps (Flink rebuilds its
``SharedStateRegistry`` from the completed-checkpoint store on recovery).

Each completed checkpoint's metadata lists, per subtask, the shared files its keyed state references
(``tasks[*].shared``). On an attempt's start, before its first checkpoint is triggered, the registry
records those of the checkpoints the completed-checkpoint store retains under their ids (they are counted
and deleted as later checkpoints subsume them) and *pins* those of the job's other completed checkpoints
(newer ones than the one restored, or ones outside the store's record): their files stay while their
folders do. Files under ``shared/`` that no completed checkpoint references are orphans (uploads of
checkpoints that never completed before a crash) and are deleted.
"""

from __future__ import annotations

import logging

from sluice.checkpoint.codec import verify_metadata
from sluice.checkpoint.completed_store import CompletedCheckpointStore
from sluice.checkpoint.state_files import CheckpointFileTransfer, refs_of
from sluice.checkpoint.storage import METADATA
from sluice.errors import SluiceError
from sluice.state.shared_registry import SharedRef, SharedStateRegistry

__all__ = ["PINNED", "recover_shared_state"]

log = logging.getLogger("sluice.checkpoint")

#: the "last user" of files of checkpoints the store does not retain: never unregistered
PINNED = 2**62


def recover_shared_state(
    store: CompletedCheckpointStore, key: bytes, restored: tuple[int, list[SharedRef]] | None
) -> SharedStateRegistry:
    """Rebuild ``store``'s registry (a fresh :class:`SharedStateRegistry`) from the job's completed
    checkpoints and delete orphaned shared files; returns the registry.

    Args:
        store: the attempt's completed-checkpoint store (its registry is replaced).
        key: the job's checkpoint key (every metadata file read is verified with it).
        restored: the checkpoint the attempt restored from the job's folder (id, its shared files), if any.
    """
    storage = store.storage
    retained = {cid for cid, _ in store.retained()}
    entries: list[tuple[int, list[SharedRef]]] = []
    complete = True
    for cid, path, savepoint in storage.completed():
        if savepoint:
            continue  # canonical, self-contained: no shared files
        if restored is not None and cid == restored[0]:
            refs = restored[1]
        else:
            try:
                meta = storage.read_metadata_at(path)
                verify_metadata(meta, key, f"{path}/{METADATA}")
                refs = refs_of(meta.get("tasks", {}).values())
            except (SluiceError, OSError) as exc:
                log.warning("shared state: cannot read checkpoint %s (%s); orphaned files are kept", path, exc)
                complete = False
                continue
        entries.append((cid if cid in retained else PINNED, refs))
    registry = SharedStateRegistry.rebuild(entries)
    store.shared = registry
    if complete:
        try:
            listed = CheckpointFileTransfer(storage).list("shared")
        except NotImplementedError:  # a storage that cannot list files: orphans stay
            return registry
        store.orphans_known = True
        orphans = registry.orphans(listed)
        if orphans:
            log.info("shared state: deleting %d file(s) no completed checkpoint references", len(orphans))
            store.discard_orphans(orphans)
    return registry
