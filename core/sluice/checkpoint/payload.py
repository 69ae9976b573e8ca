"""The bytes of one task's state in a checkpoint: operator states, source splits and channel state."""

from __future__ import annotations

import pickle
from typing import Any

__all__ = ["decode_task_state", "encode_task_state", "without_channel_state"]


def encode_task_state(payload: dict[str, Any]) -> bytes:
    """Serialize ``{"operators", "splits", "input_state", "output_state"}``."""
    return pickle.dumps(payload, protocol=5)


def decode_task_state(data: bytes) -> dict[str, Any]:
    payload: dict[str, Any] = pickle.loads(data)
    return payload


def without_channel_state(data: bytes) -> bytes:
    """The same task state without in-flight data.

    A finished task's final state is reused by later checkpoints; the in-flight data its final checkpoint
    persisted has reached its receivers by then (they record or process it before their own snapshot, as
    the channel ends), so re-sending it on a restore of a later checkpoint would duplicate it.
    """
    payload = decode_task_state(data)
    if not payload.get("input_state") and not payload.get("output_state"):
        return data
    return encode_task_state({**payload, "input_state": [], "output_state": []})
