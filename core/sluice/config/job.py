"""How to run a job: :class:`JobConfig`, built and validated by ``Pipeline``, shipped with the job to the
runtime (and, on Spark, to the executors)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.config import CheckpointConfig, FixedDelayRestart, RestartStrategy
from sluice.events import AlignmentMode
from sluice.state.config import StateBackendConfig

__all__ = ["JobConfig"]


@dataclass(frozen=True)
class JobConfig:
    """How to run a job (built and validated by ``Pipeline``)."""

    job_id: str
    checkpoint: CheckpointConfig
    restart: RestartStrategy = field(default_factory=lambda: FixedDelayRestart(attempts=3, delay=1.0))
    buffers_per_channel: int = 4
    max_batch_rows: int = 0
    #: "latest" (resume from the latest completed checkpoint if any), "none", or a checkpoint path
    restore: str = "latest"
    recover_without_channel_state: int | None = None
    #: restore even if the checkpoint holds state of operator uids the job no longer has (that state is dropped)
    allow_non_restored_state: bool = False
    #: run even if a sink's output holds checkpoints newer than the restored one (their data comes again)
    allow_reprocessing: bool = False
    #: restore operators whose state depends on settings that changed since the checkpoint (a window's size,
    #: a key's columns: docs/upgrades.md), reading the old state with the new settings
    allow_changed_operators: bool = False
    #: count the tasks' built-in metrics (records, bytes, busy and backpressured time; see docs/operations.md)
    metrics: bool = True
    #: where keyed state lives and how it is checkpointed (hashmap or rocksdb; docs/state.md)
    state_backend: StateBackendConfig = field(default_factory=StateBackendConfig)
    #: seconds an ending attempt waits for each task's threads (its task thread and its checkpoint upload
    #: thread) before the next attempt starts (Flink's ``task.cancellation.timeout``); a thread still running
    #: then is named in a warning
    task_cancellation_timeout: float = 60.0

    def alignment(self) -> AlignmentMode:
        """How the job's tasks align their (non-savepoint) checkpoints."""
        return self.checkpoint.options().alignment
