"""The file sink's committer: publishes staged files under their final names, idempotently."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sluice.sink import CommitOutcome, Committer
from sluice.sinks.files.committable import FileCommittable
from sluice.sinks.files.options import FileSinkOptions

__all__ = ["FileCommitter"]


class FileCommitter(Committer[FileCommittable]):
    """Renames (local) or completes / copies (S3) each staged file to its final name.

    Idempotent: a file already visible under its final name is skipped, so a retried commit and the
    re-commit after a restore publish nothing twice. Held committables (compaction across checkpoints)
    are skipped: a later checkpoint publishes them.
    """

    def __init__(self, options: FileSinkOptions, ctx: Any) -> None:
        self.fs = options.filesystem()
        self.ctx = ctx
        self._hook: Callable[[str], None] | None = getattr(ctx, "fault_hook", None)

    def commit(self, committables: Sequence[FileCommittable]) -> CommitOutcome:
        published = 0
        for i, c in enumerate(committables):
            if i == 1 and self._hook is not None:
                self._hook("commit")
            if not c.held and self.fs.publish(c):
                published += 1
        if published and hasattr(self.ctx, "metric"):
            self.ctx.metric("files_committed", published)
        return CommitOutcome.COMMITTED if published else CommitOutcome.ALREADY_COMMITTED

    def close(self) -> None:
        self.fs.close()
