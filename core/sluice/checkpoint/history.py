"""The job's record of its completed checkpoints, as Flink's completed-checkpoint store keeps it.

``<job-dir>/_checkpoints`` (JSON, rewritten atomically after each checkpoint's ``_metadata``) lists the
completed checkpoints and savepoints the job retains, oldest first: id, folder and kind. It is small (the
retained checkpoints and the savepoints) whatever the job's age. With the newest records of the stats
history (:meth:`~sluice.checkpoint.stats_log.CheckpointStatsLog.newest`, written right after each
checkpoint completes, while the index is rewritten in the background) it says which checkpoint (or
savepoint) completed last, so restoring "latest" when that one is missing or unreadable is refused by name
(:func:`latest_checkpoint`), never replaced by an older checkpoint or an empty start. Neither reads the
job's whole history. While a coordinator runs,
:class:`~sluice.checkpoint.completed_store.CompletedCheckpointStore` keeps the record (retention and
discards).
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from sluice.checkpoint.stats_log import CheckpointStatsLog
from sluice.checkpoint.storage import CheckpointStorage
from sluice.errors import RestoreError

__all__ = [
    "INDEX",
    "expected_latest",
    "forget_checkpoints",
    "highest_id",
    "latest_checkpoint",
    "read_index",
    "refused",
    "relative_handle",
    "sweep_incomplete",
    "write_index",
]

log = logging.getLogger("sluice.checkpoint")

#: the index of completed checkpoints in a job's folder
INDEX = "_checkpoints"


def read_index(storage: CheckpointStorage) -> dict[str, Any] | None:
    """The job's index (``{"checkpoints": [{"id", "dir", "kind"}, ...], "cleared_through": n}``), or None.

    Raises:
        RestoreError: the file is not an index (names it).
    """
    path = f"{storage.job_dir()}/{INDEX}"
    try:
        raw = storage.retrying("read the checkpoint index", storage.read_file, path)
    except FileNotFoundError:
        return None
    try:
        index = json.loads(raw)
        entries = index["checkpoints"]
        for e in entries:
            int(e["id"]), str(e["dir"]), str(e["kind"])
    except (ValueError, KeyError, TypeError) as exc:
        raise RestoreError(
            f"the job's checkpoint history {path} is corrupt ({type(exc).__name__}: {exc}); "
            + _HINT.format(example="")
        ) from None
    return index  # type: ignore[no-any-return]


def write_index(storage: CheckpointStorage, entries: dict[int, dict[str, Any]], cleared_through: int) -> None:
    """Rewrite the job's index (atomically): ``entries`` by checkpoint id, and the id through which every
    checkpoint was discarded on purpose."""
    index = {
        "job_id": storage.job_id,
        "checkpoints": [entries[cid] for cid in sorted(entries)],
        "cleared_through": cleared_through,
    }
    data = json.dumps(index, indent=1).encode()
    storage.retrying("write the checkpoint index", storage.replace, f"{storage.job_dir()}/{INDEX}", data)


def expected_latest(storage: CheckpointStorage) -> int | None:
    """The id of the job's newest completed checkpoint or savepoint as its index and the newest records of
    its stats history record it, or None if they record none."""
    index = read_index(storage) or {}
    cleared = int(index.get("cleared_through", 0))
    ids = [int(e["id"]) for e in index.get("checkpoints", [])]
    ids += [int(r["checkpoint_id"]) for r in _newest(storage) if r.get("status") == "completed"]
    ids = [i for i in ids if i > cleared]
    return max(ids, default=None)


def highest_id(storage: CheckpointStorage) -> int:
    """The highest checkpoint id the job's storage knows of (folders, complete or not, stats, index), or 0:
    ids go on above it, so no checkpoint is ever written into an older one's folder."""
    names = storage.retrying("list checkpoints", storage.list_dirs, storage.job_dir())
    ids = [int(m.group(1)) for n in names if (m := re.match(r"^(?:chk|savepoint)-(\d+)$", n))]
    ids += [int(s["checkpoint_id"]) for s in _newest(storage)]
    try:
        ids += [int(e["id"]) for e in (read_index(storage) or {}).get("checkpoints", [])]
    except RestoreError:
        pass  # a corrupt index: the coordinator rewrites it
    return max(ids, default=0)


_HINT = (
    "sluice does not fall back to an older checkpoint or to an empty start on its own: restore an older "
    "checkpoint on purpose with --restore <path> (restore=<path>){example}, or start without state with "
    "--restore none (sinks that already committed a newer checkpoint refuse either unless you also pass "
    "--allow-reprocessing: the rows after it are then written twice)"
)


def refused(what: str, older: str | None) -> RestoreError:
    """The one-line refusal of a restore of "latest": ``what`` is wrong, and how to choose on purpose."""
    return RestoreError(f"restore 'latest': {what}; " + _HINT.format(example=f", e.g. {older}" if older else ""))


def latest_checkpoint(
    storage: CheckpointStorage, expected: int | None, floor: int = 0
) -> tuple[str | None, str | None]:
    """The newest completed checkpoint or savepoint with an id >= ``floor``, and the one before it.

    Savepoints count: sinks commit them like checkpoints, so the newest of either kind is where the job's
    committed output ends (a rerun after stop-with-savepoint resumes from that savepoint; a restart after
    a crash that followed a mid-run savepoint restores it, unless a checkpoint completed after it).

    Returns (None, None) if there is none and none is ``expected``.

    Raises:
        RestoreError: checkpoint ``expected`` (the newest the job completed, by its records) is missing:
            its folder or its metadata file is gone. Older checkpoints are never taken in its place.
    """
    cleared = int((read_index(storage) or {}).get("cleared_through", 0))  # discarded on purpose (a cancel)
    done = [(cid, p) for cid, p, _ in storage.completed() if cid >= max(floor, cleared + 1)]
    present = [p for _, p in done]
    if expected is not None and (not done or done[-1][0] < expected):
        names = storage.retrying("list", storage.list_dirs, storage.job_dir())
        folder = next((n for n in names if n in (f"chk-{expected}", f"savepoint-{expected}")), None)
        where = f"{storage.job_dir()}/{folder}" if folder else storage.checkpoint_dir(expected)
        why = "it has no _metadata file" if folder else "its folder is gone"
        raise refused(
            f"the job's newest completed checkpoint {expected} ({where}) is missing: {why}",
            present[-1] if present else None,
        )
    if not present:
        return None, None
    return present[-1], present[-2] if len(present) > 1 else None


def forget_checkpoints(storage: CheckpointStorage) -> None:
    """Discard every completed checkpoint (not savepoint) of the job on purpose (a cancel that does not
    retain them): its record says so, so a later restore of "latest" starts empty instead of refusing.
    A failure is logged, not raised (what is left stays restorable)."""
    try:
        _forget(storage)
    except Exception as exc:
        log.warning("could not delete the checkpoints of job %s: %s: %s", storage.job_id, type(exc).__name__, exc)


def _forget(storage: CheckpointStorage) -> None:
    done = storage.completed()
    for cid, _, sp in done:
        if not sp:
            storage.discard(cid)
    index = read_index(storage) or {}
    newest = max([cid for cid, _, _ in done] + [int(r["checkpoint_id"]) for r in _newest(storage)], default=0)
    entries = {int(e["id"]): e for e in index.get("checkpoints", []) if e["kind"] != "checkpoint"}
    write_index(storage, entries, max(newest, int(index.get("cleared_through", 0))))


def sweep_incomplete(storage: CheckpointStorage, below: int | None = None) -> None:
    """Delete the folders of checkpoints that never completed (no metadata), unless the job's records say
    they completed (those were damaged later: left for the operator to look at); with ``below``, only those
    of lower ids (an attempt's own checkpoints start at ``below``)."""
    index = read_index(storage) or {}
    done = {int(e["id"]) for e in index.get("checkpoints", [])}
    done |= {int(r["checkpoint_id"]) for r in _newest(storage) if r.get("status") == "completed"}
    for cid, path, _ in storage.incomplete():
        if cid not in done and (below is None or cid < below):
            storage.retrying("discard", storage.delete_dir, path)
            log.info("deleted %s, left by a checkpoint that did not complete", path)


def _newest(storage: CheckpointStorage) -> list[dict[str, Any]]:
    return CheckpointStatsLog(storage).newest()


def relative_handle(handle: dict[str, Any], folder: str) -> dict[str, Any]:
    """A task's handle as the metadata records it: its state file's path relative to the checkpoint's folder."""
    path = handle.get("path")
    if isinstance(path, str) and path.startswith(folder + "/"):
        return {**handle, "path": path[len(folder) + 1 :]}
    return handle
