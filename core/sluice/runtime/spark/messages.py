"""The control protocol between the Spark driver and its slots: one frozen dataclass per message.

Slots send :class:`SlotMessage` s, which all carry the attempt number so the driver drops those of a stale
attempt; the driver sends :class:`DriverMessage` s. A slot's control connection carries, in order:

    slot -> driver   Hello, Registered, then any of Acknowledge, Decline, EndOfInput, Finished,
                     RequestSplit, Log, FaultFired, TaskFailed, SlotFailed, Metrics (also
                     every second); last Goodbye
    driver -> slot   Peers, Start, then any of TriggerCheckpoint, CheckpointComplete, CheckpointAborted,
                     AssignSplits, NoMoreSplits; last Stop or Cancel

A connection is FIFO, so everything a slot sent before its :class:`Goodbye` reaches the driver before the
connection's end; a connection that ends without a Goodbye was lost (the slot's process died).

:func:`encode` and :func:`decode` are the only (de)serialization: a pickled tuple ``(tag, *fields)``, the
tag being the message's index in :data:`MESSAGES` (append new messages, never reorder). Frames are read
only from peers that proved the job secret (:mod:`sluice.runtime.spark.rpc`), as pickle requires.
"""

from __future__ import annotations

import dataclasses
import pickle
from dataclasses import dataclass
from typing import Any

from sluice.errors import SluiceError
from sluice.events import CheckpointBarrier
from sluice.graph import SubtaskId
from sluice.source import SourceSplit

__all__ = [
    "MESSAGES",
    "Acknowledge",
    "AssignSplits",
    "Cancel",
    "CheckpointAborted",
    "CheckpointComplete",
    "Decline",
    "DriverMessage",
    "EndOfInput",
    "FaultFired",
    "Finished",
    "Goodbye",
    "Hello",
    "Log",
    "Message",
    "Metrics",
    "NoMoreSplits",
    "Peers",
    "ProtocolError",
    "Registered",
    "RequestSplit",
    "SlotFailed",
    "SlotMessage",
    "Start",
    "Stop",
    "TaskFailed",
    "TriggerCheckpoint",
    "decode",
    "encode",
]


class ProtocolError(SluiceError, ValueError):
    """A control frame is not a message of this protocol: driver and slots run different sluice versions
    (install the same sluice on the driver and the executors) or the frame is corrupt."""


@dataclass(frozen=True, slots=True)
class Message:
    """Base of every control message."""


@dataclass(frozen=True, slots=True)
class SlotMessage(Message):
    """A message from a slot to the driver.

    Attributes:
        attempt: the attempt the slot belongs to; the driver drops messages of other attempts.
    """

    attempt: int


@dataclass(frozen=True, slots=True)
class DriverMessage(Message):
    """A message from the driver to a slot (a control connection serves one attempt)."""


# -- slot -> driver ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Hello(SlotMessage):
    """First message on a slot's control connection, sent once it is authenticated.

    The driver binds the connection to ``slot`` (notifications for the slot's subtasks go there); if the
    attempt is already ending it answers with its Stop or Cancel at once. ``address`` is where the slot's
    data plane listens for its peers (the host it advertises, the port); once every slot said hello, the
    driver sends them all :class:`Peers`.
    """

    slot: int
    pid: int
    address: tuple[str, int]


@dataclass(frozen=True, slots=True)
class Registered(SlotMessage):
    """The slot reached its peers and built its subtasks (restored from the checkpoint), which it names.

    When every slot registered, the driver starts the coordinator and the enumerators and sends Start.
    """

    slot: int
    subtasks: tuple[tuple[SubtaskId, str], ...]


@dataclass(frozen=True, slots=True)
class Acknowledge(SlotMessage):
    """A subtask finished its part of checkpoint ``checkpoint_id``; ``handle`` says where its state lies
    (state itself never goes through the driver). The driver passes it to the coordinator."""

    task: SubtaskId
    checkpoint_id: int
    handle: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Decline(SlotMessage):
    """A subtask cannot complete checkpoint ``checkpoint_id``; the driver's coordinator aborts it for
    ``failure`` (a :class:`~sluice.errors.CheckpointFailureReason` name)."""

    task: SubtaskId
    checkpoint_id: int
    reason: str
    failure: str = "DECLINED"


@dataclass(frozen=True, slots=True)
class EndOfInput(SlotMessage):
    """A source subtask read all its input; the coordinator counts it towards the final checkpoint."""

    task: SubtaskId


@dataclass(frozen=True, slots=True)
class Finished(SlotMessage):
    """A subtask finished (after the final checkpoint), with its operator metrics.

    The driver records the metrics and tells the attempt; when every subtask finished it sends Stop.
    """

    task: SubtaskId
    metrics: dict[str, int]


@dataclass(frozen=True, slots=True)
class Metrics(SlotMessage):
    """A subtask's metrics: its operator counters (``metrics``) and its built-in metrics snapshot
    (``snapshot``: records, bytes, busy and backpressured time, gauges; see
    :mod:`sluice.runtime.task_metrics`; empty if the job runs without metrics).

    Sent every ``SlotSpec.metrics_interval`` seconds while the slot runs, before a subtask's Finished and
    for every unfinished subtask as the slot ends; the driver keeps the latest for the control endpoint
    and the job's result (no metrics server runs on executors).
    """

    task: SubtaskId
    metrics: dict[str, int]
    snapshot: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TaskFailed(SlotMessage):
    """A subtask raised ``error`` (or a SlotError with its text and traceback if it cannot be pickled).

    Sent before the slot stops, so it precedes the slot's Goodbye. The driver fails the attempt with it:
    a reported error ranks as a root cause above the losses and stage failures it causes.
    """

    task: SubtaskId
    error: BaseException


@dataclass(frozen=True, slots=True)
class SlotFailed(SlotMessage):
    """The slot itself failed, not one of its subtasks (set-up failed, or it lost its link to a peer).

    ``consequence`` says the failure was caused by another one (a peer that stopped, a barrier stage
    Spark aborted); the driver attaches those to the root cause and reports them as the root cause only
    when nothing else failed.
    """

    slot: int
    error: BaseException
    consequence: bool


@dataclass(frozen=True, slots=True)
class RequestSplit(SlotMessage):
    """A source subtask asks its enumerator for a split; the driver calls the enumerator."""

    task: SubtaskId


@dataclass(frozen=True, slots=True)
class Log(SlotMessage):
    """A log record of the slot (``subtask`` names the subtask whose thread logged it, if any); the driver
    re-emits it on logger ``logger`` at ``level`` with a ``[slot i] [subtask]`` prefix."""

    slot: int
    logger: str
    level: int
    subtask: str | None
    text: str


@dataclass(frozen=True, slots=True)
class FaultFired(SlotMessage):
    """Tests: an injected fault is about to crash the slot (sent synchronously, before the crash); the
    driver records ``description`` in its fault hook."""

    slot: int
    description: str


@dataclass(frozen=True, slots=True)
class Goodbye(SlotMessage):
    """Last message of a slot that ends on purpose (stopped, cancelled, or after reporting its failure).

    The driver then expects the connection to close; a connection that closes without it was lost.
    """

    slot: int


# -- driver -> slot ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Peers(DriverMessage):
    """Every slot said hello: ``addresses[i]`` is where slot ``i``'s data plane listens.

    The slots' rendezvous goes through the driver rather than Spark's ``BarrierTaskContext.allGather``,
    whose executor side polls for the answer once a second (every start and restart paid up to a second).
    """

    addresses: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class Start(DriverMessage):
    """Every slot registered and the coordinator runs: start the subtasks, logging at the driver's levels
    (``log_levels``: logger name, ``""`` for the root, to level)."""

    log_levels: dict[str, int]


@dataclass(frozen=True, slots=True)
class Stop(DriverMessage):
    """Every subtask finished: the slot ends normally (and its Spark task succeeds)."""


@dataclass(frozen=True, slots=True)
class Cancel(DriverMessage):
    """The attempt ends (a failure elsewhere, or the client cancelled): the slot cancels its subtasks and
    ends without reporting a failure of its own."""


@dataclass(frozen=True, slots=True)
class TriggerCheckpoint(DriverMessage):
    """The coordinator triggers a checkpoint at source subtask ``task``: it injects ``barrier``."""

    task: SubtaskId
    barrier: CheckpointBarrier


@dataclass(frozen=True, slots=True)
class CheckpointComplete(DriverMessage):
    """Checkpoint ``checkpoint_id`` completed: subtask ``task`` commits (sinks) what it prepared for it."""

    task: SubtaskId
    checkpoint_id: int


@dataclass(frozen=True, slots=True)
class CheckpointAborted(DriverMessage):
    """Checkpoint ``checkpoint_id`` was aborted: subtask ``task`` stops aligning for it and cleans up."""

    task: SubtaskId
    checkpoint_id: int


@dataclass(frozen=True, slots=True)
class AssignSplits(DriverMessage):
    """The source enumerator assigns ``splits`` to source subtask ``task``, which starts reading them."""

    task: SubtaskId
    splits: list[SourceSplit]


@dataclass(frozen=True, slots=True)
class NoMoreSplits(DriverMessage):
    """The enumerator has no more splits for source subtask ``task``: it finishes once its splits end."""

    task: SubtaskId


#: every message, by tag (the index): append only, so a tag keeps its meaning
MESSAGES: tuple[type[Message], ...] = (
    Hello,
    Registered,
    Acknowledge,
    Decline,
    EndOfInput,
    Finished,
    Metrics,
    TaskFailed,
    SlotFailed,
    RequestSplit,
    Log,
    FaultFired,
    Goodbye,
    Start,
    Stop,
    Cancel,
    TriggerCheckpoint,
    CheckpointComplete,
    CheckpointAborted,
    AssignSplits,
    NoMoreSplits,
    Peers,
)
_TAGS = {cls: tag for tag, cls in enumerate(MESSAGES)}
_FIELDS = {cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in MESSAGES}


def encode(msg: Message) -> bytes:
    """The frame payload of ``msg``: a pickled ``(tag, *fields)`` tuple."""
    cls = type(msg)
    tag = _TAGS.get(cls)
    if tag is None:
        raise TypeError(f"{cls.__name__} is not a control message (see MESSAGES)")
    return pickle.dumps((tag, *(getattr(msg, name) for name in _FIELDS[cls])), protocol=5)


def decode(data: bytes | bytearray | memoryview) -> Message:
    """The message of a frame payload made by :func:`encode`.

    Raises:
        ProtocolError: the payload is not a message of this protocol.
    """
    try:
        item = pickle.loads(data)
    except Exception as exc:
        raise ProtocolError(f"undecodable control frame: {exc}") from exc
    if not isinstance(item, tuple) or not item or not isinstance(item[0], int):
        raise ProtocolError(f"a control frame must be a (tag, *fields) tuple, got {type(item).__name__}")
    tag, values = item[0], item[1:]
    if not 0 <= tag < len(MESSAGES):
        raise ProtocolError(
            f"unknown control message tag {tag}: driver and slots must run the same sluice version"
        )
    cls = MESSAGES[tag]
    if len(values) != len(_FIELDS[cls]):
        raise ProtocolError(
            f"{cls.__name__} has {len(_FIELDS[cls])} field(s), the frame {len(values)}: driver and slots "
            "must run the same sluice version"
        )
    return cls(*values)
