"""The driver <-> slot control protocol: every message round-trips through the one codec, is documented,
and a frame that is not a message of this protocol is refused with a ProtocolError."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
from typing import Any

import pytest
from sluice.events import CheckpointBarrier
from sluice.graph import SubtaskId
from sluice.runtime.spark import messages as m
from sluice.source import SourceSplit

pytestmark = pytest.mark.spark

T = SubtaskId(1, 0)
#: one instance of every message
SAMPLES: list[m.Message] = [
    m.Hello(3, 1, 4242, ("10.0.0.7", 40123)),
    m.Registered(3, 1, ((T, "source (1/2)"),)),
    m.Acknowledge(3, T, 7, {"path": "chk-7/1.0", "size": 12}),
    m.Decline(3, T, 7, "upload failed"),
    m.EndOfInput(3, T),
    m.Finished(3, T, {"records_in": 5}),
    m.Metrics(3, T, {"records_in": 2}),
    m.TaskFailed(3, T, ValueError("bad row")),
    m.SlotFailed(3, 1, ConnectionError("lost its link to slot 0"), True),
    m.RequestSplit(3, T),
    m.Log(3, 1, "sluice.user", 30, "source (1/2)", "saw 10 rows"),
    m.FaultFired(3, 1, "process@x (hit 2)"),
    m.Goodbye(3, 1),
    m.Start({"": 30, "sluice": 20}),
    m.Stop(),
    m.Cancel(),
    m.TriggerCheckpoint(T, CheckpointBarrier(7, 1.5)),
    m.CheckpointComplete(T, 7),
    m.CheckpointAborted(T, 8),
    m.AssignSplits(T, [SourceSplit("p-0", 12)]),
    m.NoMoreSplits(T),
    m.Peers((("10.0.0.7", 40123), ("10.0.0.8", 40555))),
]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, BaseException):
        return type(a) is type(b) and a.args == b.args
    return bool(a == b)


def test_every_message_is_sampled_documented_and_registered() -> None:
    classes = {
        c
        for _, c in inspect.getmembers(m, inspect.isclass)
        if issubclass(c, m.Message) and c not in (m.Message, m.SlotMessage, m.DriverMessage)
    }
    assert classes == set(m.MESSAGES), "a message is missing from MESSAGES"
    assert {type(s) for s in SAMPLES} == classes
    for cls in m.MESSAGES:
        doc = inspect.getdoc(cls) or ""
        assert len(doc) > 40 and doc != inspect.getdoc(m.Message), (
            f"{cls.__name__} has no docstring of its own"
        )
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen  # type: ignore[attr-defined]
        assert issubclass(cls, (m.SlotMessage, m.DriverMessage))


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda s: type(s).__name__)
def test_round_trip(msg: m.Message) -> None:
    got = m.decode(m.encode(msg))
    assert type(got) is type(msg)
    for f in dataclasses.fields(msg):
        assert _same(getattr(got, f.name), getattr(msg, f.name)), f.name
    for f in dataclasses.fields(msg)[:1]:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(msg, f.name, 9)


def test_frames_are_compact() -> None:
    # the tag stands for the class: no module path or class name of the message on the wire
    for msg in SAMPLES:
        data = m.encode(msg)
        assert type(msg).__name__.encode() not in data, type(msg).__name__
        assert b"sluice.runtime.spark.messages" not in data


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (b"not a pickle", "undecodable control frame"),
        (pickle.dumps(["hello", 1]), r"must be a \(tag, \*fields\) tuple"),
        (pickle.dumps((len(m.MESSAGES), 1)), "unknown control message tag"),
        (pickle.dumps((m.MESSAGES.index(m.Goodbye), 1, 2, 3)), "Goodbye has 2 field"),
    ],
)
def test_foreign_frames_are_refused(payload: bytes, match: str) -> None:
    with pytest.raises(m.ProtocolError, match=match):
        m.decode(payload)
    assert issubclass(m.ProtocolError, ValueError)  # a connection reader treats it as a broken connection


def test_only_messages_are_encoded() -> None:
    with pytest.raises(TypeError, match="not a control message"):
        m.encode(("ack", 1))  # type: ignore[arg-type]
