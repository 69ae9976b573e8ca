"""The file of one task's state in a checkpoint (``<vertex>-<index>.state``): a small versioned container.

::

    b"SLUICEts" | version (u16) | header length (u32) | header (JSON) | section 0 | section 1 | ... | HMAC (32)

The header is ``{"key_id", "sections": [length, ...], "payload": <plain tree>}``: the payload (operator
states, source splits, channel state) in the plain encoding of :mod:`sluice.serializers.plain`, whose bytes
values (keyed state blobs, serialized splits and committables, Arrow IPC channel state) are the raw
sections. The trailing HMAC-SHA256 with the job's checkpoint key (:mod:`sluice.checkpoint.signing`) covers
everything before it and is checked before the header is parsed; only then may a ``pickle`` section (user
state that is not plain data) be unpickled. A file that fails any check is refused with a
:class:`~sluice.errors.RestoreError` naming it, in one line.
"""

from __future__ import annotations

import hmac
import json
import pickle
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sluice.checkpoint.signing import key_id, mac
from sluice.errors import RestoreError
from sluice.serializers import plain

__all__ = ["FORMAT_VERSION", "decode_task_state", "encode_task_state", "mac_failure", "without_channel_state"]

MAGIC = b"SLUICEts"
FORMAT_VERSION = 1
_HEAD = struct.Struct(">8sHI")
_MAC = 32


@dataclass(frozen=True)
class _Pickled:
    """A pickle section kept as bytes (re-encoding a file the job wrote itself, without unpickling it)."""

    data: bytes


def encode_task_state(payload: dict[str, Any], key: bytes) -> bytes:
    """``{"operators", "splits", "input_state", "output_state"}`` as a signed state file.

    Plain data is stored as such; a value that is not (user state) is pickled into a section of its own.
    """
    if not key:
        raise ValueError("no checkpoint key: a state file is always signed")
    sections: list[bytes] = []

    def put(data: bytes, tag: str = "bytes") -> dict[str, Any]:
        sections.append(data)
        return {"$": tag, "v": len(sections) - 1}

    def pickled(value: Any) -> dict[str, Any]:
        return put(value.data if isinstance(value, _Pickled) else pickle.dumps(value, protocol=5), "pickle")

    tree = plain.encode(payload, put, pickled)
    header = json.dumps(
        {"key_id": key_id(key), "sections": [len(s) for s in sections], "payload": tree},
        separators=(",", ":"),
        allow_nan=False,
    ).encode()
    body = b"".join([_HEAD.pack(MAGIC, FORMAT_VERSION, len(header)), header, *sections])
    return body + mac(key, body)


def decode_task_state(data: bytes, key: bytes, name: str, allow_pickle: bool = True) -> dict[str, Any]:
    """Verify and decode a state file written by :func:`encode_task_state`.

    Args:
        data: The file's bytes.
        key: The job's checkpoint key.
        name: The file (for errors).
        allow_pickle: False refuses a file that holds any pickle section (built-in jobs write none).

    Raises:
        RestoreError: not such a file, another format version, signed with another key, modified, or
            malformed; nothing of it was decoded.
    """

    def unpickle(blob: bytes) -> Any:
        try:
            return pickle.loads(blob)
        except Exception as exc:  # authenticated, so the job wrote it: its classes may be gone
            raise RestoreError(f"{name}: cannot unpickle user state: {type(exc).__name__}: {exc}") from exc

    return _decode(data, key, name, unpickle if allow_pickle else None)


def without_channel_state(
    data: bytes, key: bytes, name: str, keyed: Callable[[Any], Any] | None = None
) -> bytes:
    """The same task state without in-flight data (and each operator's keyed state handle passed through
    ``keyed``, if given).

    A finished task's final state is reused by later checkpoints; the in-flight data its final checkpoint
    persisted has reached its receivers by then (they record or process it before their own snapshot, as
    the channel ends), so re-sending it on a restore of a later checkpoint would duplicate it. User state
    is carried over as it is (never unpickled here).
    """
    payload = _decode(data, key, name, _Pickled)
    ops = payload.get("operators") or {}
    handles = {uid: st.get("keyed") for uid, st in ops.items() if isinstance(st, dict)}
    changed = {uid: keyed(h) for uid, h in handles.items()} if keyed is not None else handles
    if not payload.get("input_state") and not payload.get("output_state") and changed == handles:
        return data
    ops = {uid: {**st, "keyed": changed[uid]} if uid in changed else st for uid, st in ops.items()}
    return encode_task_state({**payload, "operators": ops, "input_state": [], "output_state": []}, key)


def _decode(data: bytes, key: bytes, name: str, unpickle: Any) -> dict[str, Any]:
    if len(data) < _HEAD.size + _MAC or data[: len(MAGIC)] != MAGIC:
        if data[:1] == b"\x80":
            raise RestoreError(
                f"{name} is a pickle, not a sluice state file: sluice no longer restores checkpoints written "
                "before its checkpoint format was authenticated (nor files planted in checkpoint storage); "
                "nothing in it was loaded. Start the job without this checkpoint (--restore none)"
            )
        raise RestoreError(f"{name} is not a sluice checkpoint state file (no {MAGIC.decode()} header)")
    _, version, header_len = _HEAD.unpack_from(data)
    if version != FORMAT_VERSION:
        raise RestoreError(
            f"{name} has checkpoint format version {version}; this sluice reads version {FORMAT_VERSION}"
        )
    body, tag = data[:-_MAC], data[-_MAC:]
    if not hmac.compare_digest(tag, mac(key, body)):
        raise RestoreError(mac_failure(name, key, _claimed_key_id(body, header_len)))

    def refuse(_: bytes) -> Any:
        raise _PickleRefusedError

    try:
        header = json.loads(body[_HEAD.size : _HEAD.size + header_len])
        lengths = header["sections"]
        if not isinstance(lengths, list) or not all(type(n) is int and n >= 0 for n in lengths):
            raise ValueError("bad section lengths")
        sections, at = [], _HEAD.size + header_len
        for n in lengths:
            sections.append(body[at : at + n])
            at += n
        if at != len(body):
            raise ValueError("sections do not fill the file")

        def section(i: int) -> bytes:
            if not 0 <= i < len(sections):
                raise plain.PlainFormatError(f"no section {i}")
            return sections[i]

        payload = plain.decode(header["payload"], section, lambda i: (unpickle or refuse)(section(i)))
    except _PickleRefusedError:
        raise RestoreError(f"{name} holds pickled state, which was not allowed here") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise RestoreError(f"{name} is malformed (a sluice state file signed with this key): {exc}") from None
    if not isinstance(payload, dict):
        raise RestoreError(f"{name} is malformed: its payload is not a mapping")
    return payload


class _PickleRefusedError(Exception):
    """A pickle section where none is allowed."""


def _claimed_key_id(body: bytes, header_len: int) -> str | None:
    """The key id an unauthenticated header claims (only to word the error)."""
    try:
        claimed = json.loads(body[_HEAD.size : _HEAD.size + header_len]).get("key_id")
    except (ValueError, AttributeError):
        return None
    return claimed if isinstance(claimed, str) and re.fullmatch(r"[0-9a-f]{12}", claimed) else None


def mac_failure(name: str, key: bytes, claimed: str | None) -> str:
    """One line: why a file's HMAC does not verify with ``key``, as far as its claimed key id tells."""
    mine = key_id(key)
    if claimed is not None and claimed != mine:
        return (
            f"{name} does not verify with this job's checkpoint key (key id {mine}); it names key id {claimed}: "
            "restore with the key that wrote it (CheckpointConfig.key or $SLUICE_CHECKPOINT_KEY), unless it "
            "was modified; nothing in it was loaded"
        )
    return (
        f"{name} failed authentication with the job's checkpoint key (key id {mine}): it was modified after "
        "the job wrote it; nothing in it was loaded"
    )
