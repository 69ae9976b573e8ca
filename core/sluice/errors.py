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

Each error says whether a restart can cure it (:attr:`SluiceError.recoverable`, as Flink's
``ThrowableClassifier`` and Arroyo's retry hints do): a wrong option, an invalid graph, a checkpoint that
cannot be restored or a record that cannot be decoded fail the same way on every attempt, so the job
fails at once instead of spending its restart budget (:func:`is_recoverable`). So do a permission denied
(``PermissionError``), S3's AccessDenied, NoSuchBucket and rejected credentials, an unknown Kafka topic and
a refused PostgreSQL login.
"""

from __future__ import annotations

import enum
import os
import pickle
import sys
from typing import Any

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
    "is_recoverable",
    "user_frame",
]


class SluiceError(Exception):
    """Root of every error sluice raises.

    Attributes:
        recoverable: whether restarting the job can cure the error (the restart strategy applies); False
            fails the job at once. A class default that an instance may override (``recoverable=False``).
    """

    recoverable: bool = True

    def __init__(self, *args: object, recoverable: bool | None = None) -> None:
        super().__init__(*args)
        if recoverable is not None:
            self.recoverable = recoverable

    def __reduce__(self) -> tuple[Any, ...]:
        # rebuilt without calling __init__ (subclasses take other arguments than their message) and with
        # its cause: a failure crosses to the Spark driver with its type, attributes and cause, so it is
        # still classified (``recoverable``) there. A cause that cannot be pickled is left behind, its
        # verdict kept in ``recoverable``.
        state = dict(self.__dict__)
        cause = self.__cause__
        if cause is not None:
            try:
                pickle.dumps(cause)
            except Exception:
                state["recoverable"] = is_recoverable(self)
                cause = None
        return (_rebuild, (type(self), self.args, state, cause))


def _rebuild(
    cls: type[SluiceError], args: tuple[object, ...], state: dict[str, Any], cause: BaseException | None = None
) -> SluiceError:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    error.__cause__ = cause
    return error


def is_recoverable(error: BaseException) -> bool:
    """Whether a restart can cure ``error``: False if it, or an error it was raised from, says it cannot,
    or is a ``PermissionError`` (permission denied: the next attempt is denied too)."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if (isinstance(e, SluiceError) and not e.recoverable) or isinstance(e, PermissionError):
            return False
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    return True


class ConfigError(SluiceError, ValueError):
    """An option has a value that is not allowed. The message names the option and what is allowed."""

    recoverable = False


class GraphError(SluiceError, ValueError):
    """The pipeline's graph is invalid (cycle, unknown stream, parallelism above max_parallelism)."""

    recoverable = False


class BadRecordError(SluiceError):
    """A record could not be decoded. Not recoverable: a restart reads the same record again.

    Attributes:
        topic: source topic (or source name).
        partition: partition (or split) of the record.
        offset: offset (or position) of the record.
        snippet: the first bytes of the raw record.
    """

    recoverable = False

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
    cancelled, or that a restored task declined because it was still taking in the restored in-flight data,
    does not.
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
    #: a restored task had not yet taken in all the in-flight data of the checkpoint it restored (Flink's
    #: ``CHECKPOINT_DECLINED_TASK_NOT_READY``): the next checkpoint after its recovery completes
    TASK_NOT_READY = ("a task had not finished recovering the restored in-flight data", False)

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

    recoverable = False


class UserFunctionError(SluiceError):
    """A user function raised. ``operator`` names the operator; ``__cause__`` is the user's exception.

    Attributes:
        operator: the operator's name.
        location: ``file:line (in function)`` of the innermost frame of the user's own code the error passed
            through (not sluice's, nor a library's: :func:`user_frame`), or None; the message shows it. Kept
            as text, so it survives the trip from a Spark executor to the driver.
    """

    def __init__(self, operator: str, error: BaseException) -> None:
        self.operator = operator
        self.location = user_frame(error)
        where = f" at {self.location}" if self.location else ""
        super().__init__(f"operator {operator!r} failed{where}: {type(error).__name__}: {error}")


def _library_paths() -> tuple[str, ...]:
    import sysconfig

    paths = sysconfig.get_paths()
    return tuple({os.path.realpath(paths[k]) + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib")})


def _is_library(module: str, path: str, libraries: tuple[str, ...]) -> bool:
    """Whether a frame of ``module`` (its code in ``path``) is sluice's, the standard library's or an
    installed package's (by its path, or its top-level package's: compiled code names relative files)."""
    top = module.partition(".")[0]
    if top == "sluice" or path.startswith("<frozen"):
        return True
    if os.path.realpath(path).startswith(libraries):
        return True
    if top in sys.builtin_module_names:
        return True
    if top == "__main__":  # the job file (run as __main__ by sluice run), not whatever __main__ is now
        return False
    package = getattr(sys.modules.get(top), "__file__", None)
    return bool(package) and not os.path.isabs(path) and os.path.realpath(str(package)).startswith(libraries)


def user_frame(error: BaseException) -> str | None:
    """``file:line (in function)`` of the innermost frame of ``error``'s traceback that is the user's code:
    not a module of sluice, not the standard library nor an installed package."""
    libraries = _library_paths()
    found = None
    tb = error.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        module = str(frame.f_globals.get("__name__", ""))
        if not _is_library(module, frame.f_code.co_filename, libraries):
            found = f"{frame.f_code.co_filename}:{tb.tb_lineno} (in {frame.f_code.co_name})"
        tb = tb.tb_next
    return found


class CommitError(SluiceError):
    """A sink could not commit (after its retries)."""


class StorageError(SluiceError):
    """A storage operation failed for good (after retries of transient errors).

    Attributes:
        operation: what was attempted (e.g. ``"PutObject"``).
        bucket: the S3 bucket (or local root) it was attempted on.
        code: the service's error code (e.g. ``"AccessDenied"``, ``"NoSuchBucket"``), or ``""``.
    """

    def __init__(
        self, message: str, *, operation: str, bucket: str, code: str = "", recoverable: bool | None = None
    ) -> None:
        self.operation = operation
        self.bucket = bucket
        self.code = code
        super().__init__(message, recoverable=recoverable)


class JobFailedError(SluiceError):
    """The job failed for good: the restart budget is spent. ``__cause__`` is the root cause."""


class IllegalTransitionError(SluiceError):
    """A state machine (e.g. a job's :class:`~sluice.runtime.status.JobStatus`) was asked to go from one
    state to another that its transition table does not allow. The message names both states."""
