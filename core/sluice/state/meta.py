"""What a backend knows about each state: its kind, serializers and TTL, checked against a restored one.

Shared by both backends: a descriptor is resolved once (:func:`resolve`) when an operator first asks for
its handle; a state restored from a checkpoint is compared with the descriptor that now reads it
(:func:`check_compatible`), because its bytes are only readable with the same serializers.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Literal

from sluice.errors import ConfigError, RestoreError
from sluice.state.api import ListStateDescriptor, MapStateDescriptor, StateDescriptor
from sluice.state.config import StateTtlConfig
from sluice.state.keycodec import state_id
from sluice.state.serializers import StateSerializer, serializer_for

__all__ = ["EVENT_TIMERS", "PROC_TIMERS", "RegisteredState", "StateMeta", "check_compatible", "resolve"]

#: the reserved state names timers are stored under (in RocksDB and in the canonical format)
EVENT_TIMERS = "\x00timer/event"
PROC_TIMERS = "\x00timer/processing"
TIMER_STATES = (EVENT_TIMERS, PROC_TIMERS)

Kind = Literal["value", "list", "map"]
_EXPIRY = struct.Struct(">q")


@dataclass(frozen=True)
class StateMeta:
    """A state's kind, serializer ids and whether it has a TTL: stored in handles as plain data."""

    kind: Kind
    serializer: str
    key_serializer: str | None
    ttl: bool

    def to_plain(self) -> dict[str, Any]:
        """As plain data for a handle."""
        return {"kind": self.kind, "serializer": self.serializer, "key_serializer": self.key_serializer, "ttl": self.ttl}

    @classmethod
    def from_plain(cls, data: dict[str, Any]) -> StateMeta:
        """From :meth:`to_plain`'s data."""
        kind = data["kind"]
        if kind not in ("value", "list", "map"):
            raise RestoreError(f"a checkpoint names a state of unknown kind {kind!r}")
        return cls(kind, str(data["serializer"]), data.get("key_serializer"), bool(data["ttl"]))


@dataclass(frozen=True)
class RegisteredState:
    """A resolved descriptor: what the handles of one state use."""

    name: str
    sid: bytes
    kind: Kind
    default: Any
    serializer: StateSerializer
    key_serializer: StateSerializer | None
    ttl: StateTtlConfig | None

    @property
    def meta(self) -> StateMeta:
        """The state's :class:`StateMeta`."""
        ks = self.key_serializer.id if self.key_serializer is not None else None
        return StateMeta(self.kind, self.serializer.id, ks, self.ttl is not None)

    def expiry(self, now: int) -> int:
        """The expiry time of a value written (or refreshed) at ``now`` (ms)."""
        assert self.ttl is not None
        return now + self.ttl.ttl_ms

    def visible(self, expiry: int, now: int) -> bool:
        """Whether a value with ``expiry`` may be returned at ``now``."""
        assert self.ttl is not None
        return expiry > now or self.ttl.visibility == "return_expired_if_not_cleaned_up"

    @property
    def refresh_on_read(self) -> bool:
        """Whether reading a value restarts its clock."""
        return self.ttl is not None and self.ttl.update_type == "on_read_and_write"


def resolve(descriptor: StateDescriptor) -> RegisteredState:
    """A descriptor's :class:`RegisteredState` (its serializers looked up, its TTL validated)."""
    if not isinstance(descriptor, StateDescriptor):
        raise ConfigError(f"state: expected a state descriptor, got {type(descriptor).__name__}")
    name = descriptor.name
    if not isinstance(name, str) or name.startswith("\x00"):
        raise ConfigError(f"state name {name!r} must be a string not starting with NUL")
    kind: Kind = (
        "list" if isinstance(descriptor, ListStateDescriptor)
        else "map" if isinstance(descriptor, MapStateDescriptor)
        else "value"
    )  # fmt: skip
    ttl = descriptor.ttl
    if isinstance(ttl, dict):
        ttl = StateTtlConfig(**ttl)
    if ttl is not None and not isinstance(ttl, StateTtlConfig):
        raise ConfigError(f"state {name!r}: ttl must be a StateTtlConfig, a dict or None (got {ttl!r})")
    key_serializer = serializer_for(descriptor.key_serializer) if kind == "map" else None
    return RegisteredState(
        name, state_id(name), kind, descriptor.default, serializer_for(descriptor.serializer), key_serializer, ttl
    )


def check_compatible(name: str, restored: StateMeta | None, now: StateMeta, ttl_layout_fixed: bool) -> None:
    """Refuse reading restored state ``name`` through a descriptor that does not fit its bytes.

    ``ttl_layout_fixed``: the backend stores the TTL inside the value bytes (RocksDB), so adding or
    removing a TTL is refused too.

    Raises:
        RestoreError: kind, serializer or (``ttl_layout_fixed``) TTL differ.
    """
    if restored is None:
        return
    diffs = []
    if restored.kind != now.kind:
        diffs.append(f"{restored.kind} state, now {now.kind} state")
    if restored.serializer != now.serializer:
        diffs.append(f"serializer {restored.serializer}, now {now.serializer}")
    if restored.key_serializer != now.key_serializer and now.kind == "map" == restored.kind:
        diffs.append(f"map key serializer {restored.key_serializer}, now {now.key_serializer}")
    if ttl_layout_fixed and restored.ttl != now.ttl:
        diffs.append("a TTL, now none" if restored.ttl else "no TTL, now one")
    if diffs:
        raise RestoreError(
            f"state {name!r} was checkpointed as {'; '.join(diffs)}: keep its descriptor as it was, or start "
            "without this checkpoint (the rocksdb backend also needs a savepoint to add or remove a TTL)"
        )


def pack_expiry(expiry: int) -> bytes:
    """An expiry time as the 8 bytes before a value with TTL."""
    return _EXPIRY.pack(expiry)


def unpack_expiry(data: bytes, at: int = 0) -> int:
    """The expiry time stored at ``data[at:]``."""
    return int(_EXPIRY.unpack_from(data, at)[0])
