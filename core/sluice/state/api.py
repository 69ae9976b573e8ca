"""Keyed state as user functions see it: value, list and map state, scoped to the current key."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

V = TypeVar("V")
K = TypeVar("K")

__all__ = [
    "ListState",
    "ListStateDescriptor",
    "MapState",
    "MapStateDescriptor",
    "StateDescriptor",
    "ValueState",
    "ValueStateDescriptor",
]


@dataclass(frozen=True)
class StateDescriptor:
    """Names a piece of keyed state. The name is its identity in checkpoints: keep it stable.

    Attributes:
        name: the state's name (1 to 255 bytes in UTF-8).
        default: what a value state returns for a key without a value.
        serializer: how values (list elements, map values) become bytes: a name such as ``"int64"`` or
            ``"string"``, a pyarrow type, a :class:`~sluice.state.serializers.StateSerializer`, or None to
            pickle them (:func:`~sluice.state.serializers.serializer_for`). Batch-wise access needs one
            with an Arrow type.
        ttl: the values' time to live (:class:`~sluice.state.config.StateTtlConfig`), or None.
        key_serializer: how a map state's entry keys become bytes (as ``serializer``).
    """

    name: str
    default: Any = None
    serializer: Any = None
    ttl: Any = None
    key_serializer: Any = None


class ValueStateDescriptor(StateDescriptor):
    """A single value per key."""


class ListStateDescriptor(StateDescriptor):
    """A list per key."""


class MapStateDescriptor(StateDescriptor):
    """A map per key."""


class _Access(Protocol):
    """What a state handle needs from the backend: read, write and copy-on-write for the current key."""

    def get(self, name: str) -> Any: ...
    def put(self, name: str, value: Any) -> None: ...
    def delete(self, name: str) -> None: ...
    def mutable(self, name: str, factory: Callable[[], Any]) -> Any: ...


class ValueState(Generic[V]):
    """One value for the current key."""

    def __init__(self, access: _Access, desc: StateDescriptor) -> None:
        self._a = access
        self._name = desc.name
        self._default = desc.default

    def value(self) -> V:
        """The value for the current key, or the descriptor's default."""
        v = self._a.get(self._name)
        return self._default if v is None else v  # type: ignore[no-any-return]

    def update(self, value: V) -> None:
        """Replace the value for the current key (``None`` clears it)."""
        if value is None:
            self._a.delete(self._name)
        else:
            self._a.put(self._name, value)

    def clear(self) -> None:
        self._a.delete(self._name)


class ListState(Generic[V]):
    """A list for the current key."""

    def __init__(self, access: _Access, desc: StateDescriptor) -> None:
        self._a = access
        self._name = desc.name

    def get(self) -> list[V]:
        """A copy of the list (empty if none)."""
        v = self._a.get(self._name)
        return list(v) if v else []

    def add(self, value: V) -> None:
        self._a.mutable(self._name, list).append(value)

    def add_all(self, values: Iterable[V]) -> None:
        self._a.mutable(self._name, list).extend(values)

    def update(self, values: Iterable[V]) -> None:
        vals = list(values)
        if vals:
            self._a.put(self._name, vals)
        else:
            self._a.delete(self._name)

    def clear(self) -> None:
        self._a.delete(self._name)


class MapState(Generic[K, V]):
    """A map for the current key."""

    def __init__(self, access: _Access, desc: StateDescriptor) -> None:
        self._a = access
        self._name = desc.name

    def _read(self) -> dict[K, V]:
        return self._a.get(self._name) or {}  # type: ignore[no-any-return, unused-ignore]

    def get(self, key: K, default: V | None = None) -> V | None:
        return self._read().get(key, default)

    def put(self, key: K, value: V) -> None:
        self._a.mutable(self._name, dict)[key] = value

    def remove(self, key: K) -> None:
        m = self._read()
        if key in m:
            self._a.mutable(self._name, dict).pop(key, None)

    def contains(self, key: K) -> bool:
        return key in self._read()

    def items(self) -> Iterator[tuple[K, V]]:
        return iter(list(self._read().items()))

    def keys(self) -> Iterator[K]:
        return iter(list(self._read()))

    def is_empty(self) -> bool:
        return not self._read()

    def clear(self) -> None:
        self._a.delete(self._name)
