"""Before an attempt writes anything: does each sink's output hold checkpoints this run would write again?

A sink's output records the highest checkpoint of the job it already holds (``Sink.committed_checkpoint``:
a table's recorded checkpoint id, the file sink's file names). An attempt that restores an older checkpoint
(an older retained one, a savepoint taken before, or none: wiped checkpoint storage, ``restore="none"``)
would read the data after its checkpoint again and commit it a second time. That is refused, naming the
sink and what to restore, unless the job allows reprocessing; then the new checkpoint ids start above
what every sink holds, so no commit is mistaken for one the output already has.
"""

from __future__ import annotations

import logging
from typing import Any

from sluice.checkpoint.storage import CheckpointStorage
from sluice.config.job import JobConfig
from sluice.errors import RestoreError
from sluice.graph import JobGraph, NodeKind
from sluice.runtime.restore import RestoredCheckpoint
from sluice.sink import Sink

__all__ = ["check_sink_lineage"]

log = logging.getLogger("sluice.job")


def check_sink_lineage(
    job: JobGraph, cfg: JobConfig, storage: CheckpointStorage, restored: RestoredCheckpoint | None
) -> int:
    """Raise RestoreError if a sink holds a checkpoint newer than ``restored`` (unless
    ``cfg.allow_reprocessing``); return the highest checkpoint id any sink holds beyond it (0 if none), the
    id the attempt's checkpoints must start above."""
    upto = restored.checkpoint_id if restored is not None else 0
    floor = 0
    for node in job.logical.nodes.values():
        if node.kind is not NodeKind.SINK:
            continue
        sink: Sink[Any] = node.spec
        committed = sink.committed_checkpoint(cfg.job_id, node.uid)
        if committed is None or committed <= upto:
            continue
        what = (
            f"restores checkpoint {restored.checkpoint_id} ({restored.path}): the data read after it"
            if restored is not None
            else "starts without a checkpoint (checkpoint storage wiped, or restore='none'): all it reads"
        )
        if not cfg.allow_reprocessing:
            raise RestoreError(
                f"sink {node.name!r} {sink!r} already holds checkpoint {committed} of job {cfg.job_id!r}, but "
                f"this run {what} would be written a second time. {_newer(storage, committed)}, or pass "
                "allow_reprocessing=True (sluice run --allow-reprocessing) to accept duplicates of that range"
            )
        log.warning(
            "sink %r %r already holds checkpoint %d of job %r and this run %s is written again "
            "(allow_reprocessing: duplicates); its checkpoint ids start above %d",
            node.name,
            sink,
            committed,
            cfg.job_id,
            what,
            committed,
        )
        floor = max(floor, committed)
    return floor


def _newer(storage: CheckpointStorage, committed: int) -> str:
    """What to restore instead: the newest completed checkpoint or savepoint at least as new as the output."""
    try:
        paths = [path for cid, path, _ in storage.completed() if cid >= committed]
    except Exception:  # only a hint: the refusal stands without it
        paths = []
    if paths:
        return f"Restore {paths[-1]} (restore=PATH, sluice run --restore PATH)"
    return "Restore the checkpoint or savepoint of the run that wrote it"
