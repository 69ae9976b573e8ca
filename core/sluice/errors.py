"""The exceptions sluice raises.

Every exception derives from :class:`SluiceError`::

    SluiceError
    ├── ConfigError            a wrong option, found when the job is built
    ├── GraphError             an invalid dataflow graph (cycle, unknown stream, parallelism)
    ├── BadRecordError         a record that cannot be decoded (names topic, partition, offset)
    ├── CheckpointError        a checkpoint failed; carries a CheckpointFailureReason
    ├── RestoreError           a checkpoint or savepoint cannot be restored
    ├── UserFunctionError      a user function raised; names the operator
    ├── CommitError            a sink could not commit after its retries
    ├── StorageError           a file system or object store refused an operation (names bucket, operation)
    ├── JobFailedError         the job failed for good; ``__cause__`` is the root cause
    └── IllegalTransitionError a state machine was asked for a transition its table does not allow
"""

from __future__ import annotations

import enum

__all__ = [
    "BadRecordError",
    "CheckpointError",
    "CheckpointFailureReason",
    "CommitError",
    "ConfigError",
    "GraphError",
    "IllegalTransitionError",
    "JobFailedError",
    "RestoreError",
    "SluiceError",
    "StorageError",
    "UserFunctionError",
]


class SluiceError(Exception):
    """Root of every error sluice raises."""


class ConfigError(SluiceError, ValueError):
    """An option has a value that is not allowed. The message names the option and what is allowed."""


class GraphError(SluiceError, ValueError):
    """The pipeline's graph is invalid (cycle, unknown stream, parallelism above max_parallelism)."""


class BadRecordError(SluiceError):
    """A record could not be decoded.

    Attributes:
        topic: source topic (or source name).
        partition: partition (or split) of the record.
        offset: offset (or position) of the record.
        snippet: the first bytes of the raw record.
    """

    def __init__(
        self, message: str, *, topic: str, partition: int, offset: int, snippet: bytes = b""
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.snippet = snippet[:120]
        super().__init__(
            f"{message} (topic={topic!r}, partition={partition}, offset={offset}, record={self.snippet!r})"
        )


class CheckpointFailureReason(enum.Enum):
    """Why a checkpoint failed: its message, and whether it counts toward ``tolerable_failed_checkpoints``.

    As in Flink, a checkpoint that expired, was declined or could not be written counts: it says something
    about the job's health. One that was subsumed, or ended because the job failed over, finished or was
    cancelled, does not.
    """

    EXPIRED = ("checkpoint expired before completing (timeout)", True)
    DECLINED = ("a task declined the checkpoint", True)
    TASK_FAILURE = ("a task failed while the checkpoint was pending", False)
    STORAGE_FAILURE = ("writing checkpoint data or metadata failed", True)
    TOO_MANY_CONCURRENT = ("too many concurrent checkpoints", False)
    JOB_FAILOVER = ("the job failed over while the checkpoint was pending", False)
    SUBSUMED = ("a later checkpoint completed first", False)
    FINISHED = ("tasks finished before the checkpoint reached them", False)
    JOB_CANCELLED = ("the job was cancelled while the checkpoint was pending", False)

    def __init__(self, message: str, counts_toward_tolerable: bool) -> None:
        self.message = message
        #: whether a failure for this reason counts toward ``tolerable_failed_checkpoints``
        self.counts_toward_tolerable = counts_toward_tolerable


class CheckpointError(SluiceError):
    """A checkpoint failed, or too many failed in a row."""

    def __init__(self, reason: CheckpointFailureReason, detail: str = "", checkpoint_id: int | None = None):
        self.reason = reason
        self.detail = detail
        self.checkpoint_id = checkpoint_id
        where = f"checkpoint {checkpoint_id}: " if checkpoint_id is not None else ""
        super().__init__(f"{where}{reason.message}" + (f": {detail}" if detail else ""))


class RestoreError(SluiceError):
    """A checkpoint or savepoint cannot be restored (missing metadata, incompatible graph, ...)."""


class UserFunctionError(SluiceError):
    """A user function raised. ``operator`` names the operator; ``__cause__`` is the user's exception."""

    def __init__(self, operator: str, error: BaseException) -> None:
        self.operator = operator
        super().__init__(f"operator {operator!r} failed: {type(error).__name__}: {error}")


class CommitError(SluiceError):
    """A sink could not commit (after its retries)."""


class StorageError(SluiceError):
    """A storage operation failed for good (after retries of transient errors).

    Attributes:
        operation: what was attempted (e.g. ``"PutObject"``).
        bucket: the S3 bucket (or local root) it was attempted on.
        code: the service's error code (e.g. ``"AccessDenied"``, ``"NoSuchBucket"``), or ``""``.
    """

    def __init__(self, message: str, *, operation: str, bucket: str, code: str = "") -> None:
        self.operation = operation
        self.bucket = bucket
        self.code = code
        super().__init__(message)


class JobFailedError(SluiceError):
    """The job failed for good: the restart budget is spent. ``__cause__`` is the root cause."""


class IllegalTransitionError(SluiceError):
    """A state machine (e.g. a job's :class:`~sluice.runtime.status.JobStatus`) was asked to go from one
    state to another that its transition table does not allow. The message names both states."""
