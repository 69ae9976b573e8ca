"""The file sink's writer: per-bucket in-progress files, rolled on policy and staged at pre-commit."""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from typing import Any, cast

import pyarrow as pa
from sluice.sink import SinkContext, SinkWriter
from sluice.sinks.files.committable import (
    FileCommittable,
    final_name,
    inprogress_name,
    run_token,
    staging_name,
)
from sluice.sinks.files.errors import SchemaMismatchError
from sluice.sinks.files.formats import FormatWriter, extension, open_writer, schema_fingerprint
from sluice.sinks.files.options import FileSinkOptions

__all__ = ["FileSinkWriter"]


@dataclass
class _InProgress:
    bucket: str
    local_path: str
    writer: FormatWriter
    schema: pa.Schema
    opened_at: float
    last_write: float


class FileSinkWriter(SinkWriter[FileCommittable]):
    """Writes each bucket's rows to its in-progress file; hands staged files over at every checkpoint.

    State (``snapshot_state``): the small files held back for compaction across checkpoints. Open files
    are not part of it: after a restore the source replays everything after the checkpoint, and
    ``FileSink.recover`` deletes the in-progress files of the failed attempt.
    """

    def __init__(self, options: FileSinkOptions, ctx: SinkContext, restored: list[Any]) -> None:
        self.options = options
        self.ctx = ctx
        self.fs = options.filesystem()
        self.opts = options.format_options()
        self.ext = extension(self.opts)
        self.assigner = options.bucket_assigner()
        self.rolling = options.rolling
        self.open: dict[str, _InProgress] = {}
        self.rolled: list[_InProgress] = []
        self.schemas: dict[str, pa.Schema] = {}
        self.held: dict[str, list[FileCommittable]] = {}
        self.held_age: dict[str, int] = {}
        for st in restored:
            for c in (st or {}).get("held", []):
                self.held.setdefault(c.bucket, []).append(c.as_held(False))
            for bucket, age in (st or {}).get("held_age", {}).items():
                self.held_age[bucket] = max(age, self.held_age.get(bucket, 0))
        self._run = run_token()
        self._final = False
        self._closed = False
        self._last_idle_check = time.monotonic()

    # -- writing ---------------------------------------------------------------------------------------
    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        now = time.time()
        for bucket, rows in self.assigner.split(batch, now):
            if rows.num_rows == 0:
                continue
            f = self.open.get(bucket)
            known = f.schema if f is not None else self.schemas.get(bucket)
            if known is not None and not rows.schema.equals(known, check_metadata=False):
                if not self.options.schema_evolution:
                    raise SchemaMismatchError(
                        f"FileSink {self.options.name!r}: a batch for bucket {bucket or '(root)'!r} of "
                        f"{self.options.path} has schema\n{rows.schema}\n"
                        f"but the bucket's file has schema\n{known}\n"
                        "fix the upstream schema, or set schema_evolution=True to roll to a new file"
                    )
                if f is not None:
                    self._roll(bucket)
                    f = None
            if f is None:
                f = self._open(bucket, rows.schema, now)
            f.writer.write(rows)
            f.last_write = now
            if self.rolling.should_roll(f.writer.size(), f.opened_at, now):
                self._roll(bucket)
        self._roll_idle(now)

    def _open(self, bucket: str, schema: pa.Schema, now: float) -> _InProgress:
        self.options.check_schema(schema)  # a stream whose schema the job did not know when it was built
        rel = inprogress_name(
            bucket, self.ctx.job_id, self.ctx.subtask, uuid.uuid4().hex[:12], self.ext, self.ctx.attempt
        )
        path = self.fs.inprogress_path(rel)
        f = _InProgress(bucket, path, open_writer(path, schema, self.opts), schema, now, now)
        self.open[bucket] = f
        self.schemas[bucket] = schema
        return f

    def _roll(self, bucket: str) -> None:
        f = self.open.pop(bucket)
        f.writer.close()
        self.rolled.append(f)

    def _roll_idle(self, now: float) -> None:
        idle = self.rolling.inactivity_interval
        if idle is None or time.monotonic() - self._last_idle_check < min(1.0, cast(float, idle) / 4):
            return
        self._last_idle_check = time.monotonic()
        for b in [b for b, f in self.open.items() if self.rolling.inactive(f.last_write, now)]:
            self._roll(b)

    # -- checkpoints -----------------------------------------------------------------------------------
    def prepare_commit(self, checkpoint_id: int) -> list[FileCommittable]:
        """Roll every open file and stage all rolled ones (durable, hidden) under names of this checkpoint."""
        for b in list(self.open):
            self._roll(b)
        staged: list[FileCommittable] = []
        rolled, self.rolled = self.rolled, []
        for seq, f in enumerate(rolled):
            if f.writer.rows == 0:
                self.fs.discard_local(f.local_path)
                continue
            final = final_name(
                f.bucket, self.ctx.job_id, checkpoint_id, self.ctx.subtask, f"{seq:04d}", self.ext, self._run
            )
            size = os.path.getsize(f.local_path)
            s = self.fs.stage(f.local_path, staging_name(final, self.ctx.attempt, "pending"), final)
            staged.append(
                FileCommittable(
                    f.bucket,
                    final,
                    s.staged,
                    size,
                    f.writer.rows,
                    checkpoint_id,
                    schema_fingerprint(f.schema),
                    s.upload_id,
                    s.parts,
                )
            )
            self.ctx.metric("files_staged")
        return self._hold_back(staged)

    def _hold_back(self, staged: list[FileCommittable]) -> list[FileCommittable]:
        """Keep a bucket's small files for a later checkpoint while they are below the target in total."""
        policy = self.options.compaction
        if policy is None or (policy.max_checkpoints <= 1 and not self.held):
            return staged
        out: list[FileCommittable] = []
        new: dict[str, list[FileCommittable]] = {}
        for c in staged:
            (new.setdefault(c.bucket, []) if policy.candidate(c) else out).append(c)
        for b in list(dict.fromkeys([*new, *self.held])):
            files = self.held.get(b, []) + new.get(b, [])
            age = self.held_age.get(b, 0)
            if (
                not self._final
                and age + 1 < policy.max_checkpoints
                and sum(c.size for c in files) < policy.target_size
            ):
                self.held[b], self.held_age[b] = files, age + 1
                out.extend(c.as_held() for c in files)  # named in the checkpoint, published later
            else:
                self.held.pop(b, None)
                self.held_age.pop(b, None)
                out.extend(files)
        return out

    def snapshot_state(self, checkpoint_id: int) -> Any:
        held = [c for files in self.held.values() for c in files]
        return {"held": held, "held_age": dict(self.held_age)} if held else None

    def end_input(self) -> None:
        """Close every file and release held ones, so the final checkpoint publishes all data."""
        for b in list(self.open):
            self._roll(b)
        self._final = True

    def close(self) -> None:
        self._closed = True
        for f in [*self.open.values(), *self.rolled]:
            try:
                f.writer.close()
            except Exception:
                pass
            self.fs.discard_local(f.local_path)
        self.open.clear()
        self.rolled.clear()
        self.fs.close()
