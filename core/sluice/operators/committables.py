"""What a sink's operators keep and send: commits retried with backoff, the task-state form of writer
states and pending committables (the sink's own serializers), and committables as rows between a sink's
writer stage and its compactor stage."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import tenacity

from sluice.checkpoint.codec import envelope, open_envelope, read_commit_groups, write_commit_groups
from sluice.checkpoint.global_commit import CommitGroups
from sluice.errors import CommitError, is_recoverable
from sluice.serializers import SimpleVersionedSerializer
from sluice.sink import CommitOutcome, Sink

__all__ = [
    "COMMITTABLES",
    "commit_with_retry",
    "decode_committables",
    "encode_committables",
    "pack_pending",
    "pack_writer_state",
    "unpack_pending",
    "unpack_writer_state",
]

log = logging.getLogger("sluice.sink")


class _RetryLater(Exception):
    """A committer returned ``CommitOutcome.RETRY_LATER``: retried like an error, counted apart."""


def commit_with_retry(
    name: str,
    commit: Callable[..., CommitOutcome | None],
    *args: Any,
    attempts: int = 5,
    metric: Callable[[str, int], None] | None = None,
) -> CommitOutcome:
    """Call ``commit(*args)``, retrying failures and ``RETRY_LATER`` with exponential backoff (tenacity).

    Returns the outcome (a committer written before outcomes existed returns None: counted as committed).
    An error a restart cannot cure (``sluice.errors.is_recoverable``, e.g. a ConfigError) is raised at once.
    Metrics: ``commits`` and ``commits_already_committed`` per call, ``commit_retries`` per retry,
    ``commit_time_us`` the time the call took (retries included).
    """
    count = metric or (lambda _name, _n: None)

    def once() -> CommitOutcome:
        outcome = commit(*args) or CommitOutcome.COMMITTED
        if outcome is CommitOutcome.RETRY_LATER:
            raise _RetryLater("the committer asked to retry later")
        return outcome

    def before_sleep(rs: tenacity.RetryCallState) -> None:
        count("commit_retries", 1)
        exc = rs.outcome.exception() if rs.outcome is not None else None
        level = logging.INFO if isinstance(exc, _RetryLater) else logging.WARNING
        log.log(level, "%s: commit not done (attempt %d), retrying: %s", name, rs.attempt_number, exc)

    started = time.perf_counter()
    try:
        outcome: CommitOutcome = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(attempts),
            wait=tenacity.wait_exponential(multiplier=0.05, max=2.0),
            retry=tenacity.retry_if_exception(lambda e: isinstance(e, Exception) and is_recoverable(e)),
            reraise=True,
            before_sleep=before_sleep,
        )(once)
    except Exception as exc:
        if not is_recoverable(exc):
            raise  # neither a retry nor a restart can cure it: fails the job at once
        raise CommitError(f"sink {name!r}: commit failed after {attempts} attempts: {exc}") from exc
    count("commits" if outcome is CommitOutcome.COMMITTED else "commits_already_committed", 1)
    count("commit_time_us", int((time.perf_counter() - started) * 1e6))
    return outcome


def pack_writer_state(sink: Sink[Any], state: Any) -> Any:
    """A writer's snapshot as the task state stores it: None, or its sink's writer-state serializer's
    envelope."""
    return None if state is None else envelope(sink.writer_state_serializer(), state)


def unpack_writer_state(sink: Sink[Any], stored: Any, name: str) -> Any:
    """Inverse of :func:`pack_writer_state` (RestoreError naming the sink if it cannot be read)."""
    if stored is None:
        return None
    return open_envelope(sink.writer_state_serializer(), stored, f"sink {name!r}: a writer state")


def pack_pending(sink: Sink[Any], groups: CommitGroups) -> list[Any]:
    """Committables not committed yet, by checkpoint, as the task state stores them."""
    return write_commit_groups(groups, sink.committable_serializer())


def unpack_pending(sink: Sink[Any], stored: Any, name: str) -> CommitGroups:
    """Inverse of :func:`pack_pending`."""
    if not stored:
        return []
    return read_commit_groups(stored, sink.committable_serializer(), f"sink {name!r}: pending committables")


#: the schema of committables travelling from a sink's writer stage to its compactor stage
COMMITTABLES = pa.schema([("key", pa.string()), ("version", pa.int32()), ("committable", pa.binary())])


def encode_committables(
    committables: list[Any], key: Callable[[Any], str], serializer: SimpleVersionedSerializer[Any]
) -> pa.RecordBatch:
    """Committables as rows: the compactor key (for the hash exchange) and the committable, written by the
    sink's committable serializer."""
    return pa.RecordBatch.from_arrays(
        [
            pa.array([key(c) for c in committables], pa.string()),
            pa.array([serializer.version] * len(committables), pa.int32()),
            pa.array([serializer.serialize(c) for c in committables], pa.binary()),
        ],
        schema=COMMITTABLES,
    )


def decode_committables(batch: pa.RecordBatch, serializer: SimpleVersionedSerializer[Any]) -> list[Any]:
    """Inverse of :func:`encode_committables`."""
    versions = batch.column("version").to_pylist()
    data = batch.column("committable").to_pylist()
    return [serializer.deserialize(v, b) for v, b in zip(versions, data, strict=True)]
