"""A two-phase-commit sink for tests: Arrow IPC files moved from ``pending/`` to ``committed/`` on commit.

It is the reference the fault-injection suite reads back: :func:`read_committed` is what a downstream
reader would see. Pending file names are unique per (job, subtask, attempt, checkpoint), commit is an
atomic rename that is skipped when already done, and :meth:`TwoPhaseCommitTestSink.recover` deletes pending
files no completed checkpoint refers to. The committed names are its lineage record
(:meth:`TwoPhaseCommitTestSink.committed_checkpoint`), so every fault scenario also checks that no restore
is refused that should not be.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from sluice.errors import CommitError
from sluice.serializers import JsonSerializer, SimpleVersionedSerializer
from sluice.sink import (
    CommitOutcome,
    Committer,
    GlobalCommitter,
    GlobalCommitterContext,
    Sink,
    SinkContext,
    SinkWriter,
)

__all__ = ["TwoPhaseCommitTestSink", "read_committed"]

_COMMITTED = re.compile(r"^(\d{8})-\d{3}-a\d+\.arrow$")


class _Writer(SinkWriter[str]):
    def __init__(self, sink: TwoPhaseCommitTestSink, ctx: SinkContext) -> None:
        self.sink = sink
        self.ctx = ctx
        self.buffer: list[pa.RecordBatch] = []

    def write(self, batch: pa.RecordBatch) -> None:
        self.buffer.append(batch)

    def prepare_commit(self, checkpoint_id: int) -> list[str]:
        if not self.buffer:
            return []
        name = f"{self.ctx.job_id}-{checkpoint_id:08d}-{self.ctx.subtask:03d}-a{self.ctx.attempt}.arrow"
        table = pa.Table.from_batches(self.buffer)
        path = os.path.join(self.sink.directory, "pending", name)
        tmp = path + ".inprogress"
        with pa.OSFile(tmp, "wb") as f, pa.ipc.new_file(f, table.schema) as w:
            w.write_table(table)
        os.replace(tmp, path)
        self.buffer = []
        return [name]


class _Committer(Committer[str], GlobalCommitter[str]):
    def __init__(self, sink: TwoPhaseCommitTestSink, ctx: SinkContext | GlobalCommitterContext) -> None:
        self.sink = sink
        self.ctx = ctx

    def commit(self, *args: Any) -> CommitOutcome:
        committables: Sequence[str] = args[-1]
        published = 0
        for i, name in enumerate(committables):
            src = os.path.join(self.sink.directory, "pending", name)
            dst = os.path.join(self.sink.directory, "committed", name)
            if not os.path.exists(dst):  # already committed: commit is idempotent
                if not os.path.exists(src):
                    raise CommitError(f"committable {name} is neither pending nor committed: its data is lost")
                os.replace(src, dst)
                published += 1
            if i == 0:
                self.ctx.fault_hook("commit")  # in the middle of a commit: the first committable is published
        return CommitOutcome.COMMITTED if published or not committables else CommitOutcome.ALREADY_COMMITTED


class _NameSerializer(JsonSerializer[str]):
    def to_json(self, obj: str) -> Any:
        return str(obj)

    def from_json(self, version: int, value: Any) -> str:
        if not isinstance(value, str):
            raise TypeError("a committable of the test sink is a file name")
        return value


class TwoPhaseCommitTestSink(Sink[str]):
    """Arrow files in ``directory``: pending at pre-commit, committed when the checkpoint completes.

    Args:
        directory: where ``pending/`` and ``committed/`` live.
        global_commit: commit on the coordinator (once per checkpoint) instead of in every subtask.
    """

    name = "test-sink"

    def __init__(self, directory: str, global_commit: bool = False, name: str = "test-sink") -> None:
        self.directory = str(directory)
        self.global_commit = global_commit
        self.name = name
        os.makedirs(os.path.join(self.directory, "pending"), exist_ok=True)
        os.makedirs(os.path.join(self.directory, "committed"), exist_ok=True)

    def create_writer(self, ctx: SinkContext, restored: list[Any]) -> SinkWriter[str]:
        return _Writer(self, ctx)

    def create_committer(self, ctx: SinkContext) -> Committer[str] | None:
        return None if self.global_commit else _Committer(self, ctx)

    def create_global_committer(self, ctx: GlobalCommitterContext) -> GlobalCommitter[str] | None:
        return _Committer(self, ctx)

    def committed_checkpoint(self, job_id: str, sink_uid: str) -> int | None:
        """The newest checkpoint of ``job_id`` among the committed file names (0 if none)."""
        head = f"{job_id}-"
        names = os.listdir(os.path.join(self.directory, "committed"))
        tails = [n[len(head) :] for n in names if n.startswith(head)]
        return max((int(m.group(1)) for t in tails if (m := _COMMITTED.match(t))), default=0)

    def committable_serializer(self) -> SimpleVersionedSerializer[str]:
        """Committables (pending file names) go into checkpoints as JSON strings."""
        return _NameSerializer()

    def recover(self, job_id: str, committables: Sequence[str]) -> None:
        keep = set(committables)
        pending = os.path.join(self.directory, "pending")
        for name in os.listdir(pending):
            if name.startswith(f"{job_id}-") and name not in keep:
                os.remove(os.path.join(pending, name))


def read_committed(directory: str) -> pa.Table | None:
    """Everything committed so far, in commit-name order (None if nothing)."""
    d = os.path.join(str(directory), "committed")
    tables = []
    for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        with pa.memory_map(os.path.join(d, name)) as f:
            tables.append(pa.ipc.open_file(f).read_all())
    return pa.concat_tables(tables) if tables else None
