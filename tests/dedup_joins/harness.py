"""Running one operator outside a job: a context over every key group, a collector that keeps what it gets,
and snapshot-then-restore into a fresh instance (the synchronous and asynchronous parts of a checkpoint)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from sluice.operators.base import Operator, OperatorContext
from sluice.state.config import StateBackendConfig
from sluice.state.factory import state_backend_for
from sluice.state.keygroups import KeyGroupRange
from sluice.state.transfer import LocalFileTransfer

from tests.faults.shapes import BACKENDS

MAX_PARALLELISM = 16


class Collected:
    """A collector: emitted batches and watermarks."""

    def __init__(self) -> None:
        self.batches: list[pa.RecordBatch] = []
        self.watermarks: list[int] = []

    def emit(self, batch: pa.RecordBatch) -> None:
        self.batches.append(batch)

    def emit_side(self, tag: str, batch: pa.RecordBatch) -> None:
        raise AssertionError(f"unexpected side output {tag}")

    def has_side(self, tag: str) -> bool:
        return False

    def emit_watermark(self, timestamp: int) -> None:
        self.watermarks.append(timestamp)

    def rows(self) -> list[dict[str, Any]]:
        """Everything emitted so far, as rows (then forgotten)."""
        out = [r for b in self.batches for r in b.to_pylist()]
        self.batches.clear()
        return out


class Harness:
    """``make()`` builds the operator; :meth:`restart` snapshots it and restores a new one from that."""

    def __init__(self, make: Callable[[], Operator], backend: str) -> None:
        self.make = make
        self.config = StateBackendConfig(**(BACKENDS[backend] or {}))
        self.files = LocalFileTransfer(tempfile.mkdtemp(prefix="sluice-harness-"))
        self.checkpoint = 0
        self.op, self.out = self._start([], [])

    def _start(self, keyed: list[dict[str, Any]], operator: list[Any]) -> tuple[Any, Collected]:
        op, out = self.make(), Collected()
        ctx = OperatorContext(
            name=op.name, subtask=0, parallelism=1, max_parallelism=MAX_PARALLELISM,
            key_groups=KeyGroupRange(0, MAX_PARALLELISM), job_id="harness", attempt=0,
            state_backend=state_backend_for(self.config), state_files=self.files,
        )  # fmt: skip
        op.setup(ctx, out)
        op.initialize_state(keyed, operator)
        op.open()
        return op, out

    def restart(self) -> None:
        """Checkpoint, close, and restore a fresh instance of the operator from that checkpoint."""
        self.checkpoint += 1
        snap = self.op.snapshot_state(self.checkpoint)
        handle = snap.keyed.run() if snap.keyed is not None else None
        self.op.close()
        self.op, self.out = self._start([handle] if handle else [], [snap.operator])
