"""Small-file compaction: a bucket's small staged files, from all writer subtasks, are merged into
target-size files before they are published.

With a compaction policy the FileSink runs a compactor stage keyed by bucket (:class:`FileCompactor`, the
sink's :class:`~sluice.sink.Compactor`): every writer hands its staged files over at the barrier, and the
one compactor subtask of each bucket merges them in the asynchronous part of the same checkpoint, before it
is acknowledged; so only the merged committables go into the checkpoint and visibility is not delayed
beyond the usual one checkpoint (unless ``max_checkpoints`` > 1 lets writers hold small files back to merge
them with later ones).

Crash safety, step by step (each step is a ``compaction`` fault point):

1. the merged file is written as a hidden in-progress file, then staged (durable) under a hidden pending name;
2. only then are the originals staged by *this* checkpoint deleted; originals of earlier checkpoints (held
   back, so a completed checkpoint may still name them) are deleted only when the merged file is published
   (``FileCommittable.replaces``);
3. the merged committables replace the originals in the checkpoint.

A crash anywhere leaves a checkpoint that never completes; ``FileSink.recover`` deletes every staged file the
restored checkpoint does not name, which covers half-written merges and surviving originals alike.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from sluice.errors import ConfigError
from sluice.sink import Compactor, SinkContext
from sluice.sinks.files.committable import FileCommittable, final_name, run_token, staging_name
from sluice.sinks.files.filesystem import FileSystem
from sluice.sinks.files.formats import FormatOptions, extension, merge

__all__ = ["CompactionPolicy", "FileCompactor"]


@dataclass(frozen=True)
class CompactionPolicy:
    """Which files are merged.

    Attributes:
        target_size: bytes; staged files smaller than this are merged into files of about this size.
        max_checkpoints: a bucket's small files may be held back for up to this many checkpoints to be
            merged with later ones (1 = merge only within a checkpoint: no extra visibility delay).
    """

    target_size: int = 128 * 1024 * 1024
    max_checkpoints: int = 1

    def validate(self) -> None:
        """Raise ConfigError naming the option and the allowed values."""
        if (
            isinstance(self.target_size, bool)
            or not isinstance(self.target_size, int)
            or self.target_size < 1
        ):
            raise ConfigError(
                f"FileSink: compaction.target_size must be an integer number of bytes >= 1 "
                f"(got {self.target_size!r})"
            )
        if (
            isinstance(self.max_checkpoints, bool)
            or not isinstance(self.max_checkpoints, int)
            or self.max_checkpoints < 1
        ):
            raise ConfigError(
                f"FileSink: compaction.max_checkpoints must be an integer >= 1 (got {self.max_checkpoints!r})"
            )

    def candidate(self, c: FileCommittable) -> bool:
        """Small enough to merge, and readable (not an uncompleted multipart upload)."""
        return not c.held and c.upload_id is None and c.size < self.target_size


class _Cancelled(Exception):
    pass


class FileCompactor(Compactor[FileCommittable]):
    """Merges a bucket's small staged files of one checkpoint, whichever writer staged them.

    Args:
        policy: which files merge.
        fs: the sink's file system (closed with the compactor).
        opts: the format of merged files.
        ctx: the compactor subtask's context (job id, subtask, attempt, fault hook ``compaction``).
    """

    def __init__(self, policy: CompactionPolicy, fs: FileSystem, opts: FormatOptions, ctx: SinkContext) -> None:
        self.policy = policy
        self.fs = fs
        self.opts = opts
        self.job_id = ctx.job_id
        self.subtask = ctx.subtask
        self.attempt = ctx.attempt
        self.hook: Callable[[str], None] = ctx.fault_hook
        self._closed = False
        self._run = run_token()

    def key(self, committable: FileCommittable) -> str:
        return committable.bucket

    def cancelled(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True
        self.fs.close()

    def plan(self, committables: list[FileCommittable]) -> list[list[FileCommittable]]:
        """Groups to merge: per (bucket, schema), consecutive small files up to the target size; >= 2 each."""
        groups: dict[tuple[str, str], list[FileCommittable]] = {}
        for c in committables:
            if self.policy.candidate(c):
                groups.setdefault((c.bucket, c.schema_fp), []).append(c)
        bins: list[list[FileCommittable]] = []
        for files in groups.values():
            cur: list[FileCommittable] = []
            size = 0
            for c in files:
                if cur and size + c.size > self.policy.target_size:
                    bins.append(cur)
                    cur, size = [], 0
                cur.append(c)
                size += c.size
            bins.append(cur)
        return [b for b in bins if len(b) >= 2]

    def compact(self, checkpoint_id: int, committables: list[FileCommittable]) -> list[FileCommittable]:
        """Merge; returns what replaces ``committables`` (untouched ones first, then merged ones)."""
        bins = self.plan(committables)
        merged_ids = {id(c) for b in bins for c in b}
        out = [c for c in committables if id(c) not in merged_ids]
        for k, group in enumerate(bins):
            out.append(self._merge(checkpoint_id, k, group))
        return out

    def _merge(self, checkpoint_id: int, k: int, group: list[FileCommittable]) -> FileCommittable:
        first = group[0]
        final = final_name(
            first.bucket, self.job_id, checkpoint_id, self.subtask, f"c{k:03d}", extension(self.opts), self._run
        )
        local = self.fs.inprogress_path(staging_name(final, self.attempt, "inprogress"))
        self.hook("compaction")
        merge((self.fs.open_staged(c) for c in group), local, None, self.opts)
        if self.cancelled():
            self.fs.discard_local(local)
            raise _Cancelled(f"writer closed while compacting checkpoint {checkpoint_id}")
        size = os.path.getsize(local)
        staged = self.fs.stage(local, staging_name(final, self.attempt, "pending"), final)
        self.hook("compaction")  # merged file durable, originals still there
        own = [c for c in group if c.checkpoint_id == checkpoint_id]
        older = [c.staged for c in group if c.checkpoint_id != checkpoint_id]
        replaces = tuple(older) + tuple(r for c in group for r in c.replaces)
        for i, c in enumerate(own):
            self.fs.delete_staged(c.staged)
            if i == 0:
                self.hook("compaction")  # some originals deleted
        return FileCommittable(
            first.bucket,
            final,
            staged.staged,
            size,
            sum(c.rows for c in group),
            checkpoint_id,
            first.schema_fp,
            staged.upload_id,
            staged.parts,
            replaces=replaces,
        )
