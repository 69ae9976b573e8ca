"""The bookkeeping the built-in keyed backends share: states registered by descriptor, and their handles.

A state name is resolved from its first descriptor (kind, serializer, TTL: :func:`~sluice.state.meta.resolve`)
and checked against the state a restore brought under that name
(:func:`~sluice.state.meta.check_compatible`); a later descriptor of the same name with another kind,
serializer or TTL is refused. Each name gets one per-key handle, made on first use. The backends differ only
in their handle classes, in whether a TTL is part of the stored layout, and in what a registration loads
(:meth:`RegisteringKeyedStateBackend.on_register`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from sluice.errors import ConfigError
from sluice.state.meta import RegisteredState, StateMeta, check_compatible, resolve
from sluice.state.spi import BatchValueState, KeyedStateBackend

if TYPE_CHECKING:
    from sluice.state.keygroups import KeyGroupRange
    from sluice.state.spi import StatePaths
    from sluice.state.transfer import FileTransfer

__all__ = ["RegisteringKeyedStateBackend"]


class RegisteringKeyedStateBackend(KeyedStateBackend):
    """A keyed backend whose states are registered by descriptor (module docstring).

    Subclasses set :attr:`handle_classes`, :attr:`batch_class` and :attr:`ttl_layout_fixed`.
    """

    #: the per-key handle class of each state kind (``"value"``, ``"list"``, ``"map"``), made as
    #: ``cls(backend, registered_state)``
    handle_classes: ClassVar[Mapping[str, type[Any]]]
    #: the batch-wise handle class of value states (a :class:`~sluice.state.spi.BatchValueState`), made the
    #: same way
    batch_class: ClassVar[type[Any]]
    #: whether adding or removing a state's TTL changes its stored bytes (then a restore refuses it)
    ttl_layout_fixed: ClassVar[bool]

    def __init__(
        self,
        key_groups: KeyGroupRange,
        max_parallelism: int,
        transfer: FileTransfer,
        paths: StatePaths,
        clock: Callable[[], int] | None = None,
    ) -> None:
        super().__init__(key_groups, max_parallelism, transfer, paths, clock)
        self._registered: dict[str, RegisteredState] = {}
        self._handles: dict[str, Any] = {}
        #: the meta of every state the last restores brought, by name
        self.restored_meta: dict[str, StateMeta] = {}

    def register(self, descriptor: Any) -> RegisteredState:
        """The registered state of ``descriptor``'s name (registered now on first use).

        Raises:
            ConfigError: the name is registered with another kind, serializer or TTL.
            RestoreError: the restored state of that name is not compatible.
        """
        reg = self._registered.get(descriptor.name)
        if reg is None:
            reg = resolve(descriptor)
            check_compatible(
                reg.name, self.restored_meta.get(reg.name), reg.meta, ttl_layout_fixed=self.ttl_layout_fixed
            )
            self._registered[reg.name] = reg
            self.on_register(reg)
        elif resolve(descriptor).meta != reg.meta:
            raise ConfigError(f"state {reg.name!r} is already used with another kind, serializer or TTL")
        return reg

    def on_register(self, reg: RegisteredState) -> None:
        """``reg`` was registered just now (the hashmap backend loads the rows a restore left for it)."""

    def state(self, descriptor: Any) -> Any:
        h = self._handles.get(descriptor.name)
        if h is not None and h.descriptor != descriptor:
            self.register(descriptor)  # refuses another kind, serializer or TTL
        if h is None:
            reg = self.register(descriptor)
            h = self._handles[reg.name] = self.handle_classes[reg.kind](self, reg)
            h.descriptor = descriptor
        return h

    def batch_state(self, descriptor: Any) -> BatchValueState:
        reg = self.register(descriptor)
        if reg.kind != "value" or reg.serializer.arrow_type is None:
            raise ConfigError(
                f"state {reg.name!r}: batch-wise access needs a value state whose serializer has an Arrow type "
                f"(got {reg.kind} state with serializer {reg.serializer.id!r})"
            )
        batch: BatchValueState = self.batch_class(self, reg)
        return batch

    def forget_state(self, name: str) -> None:
        """Forget state ``name``: its registration, its restored meta and its handle."""
        for d in (self._registered, self.restored_meta, self._handles):
            d.pop(name, None)

    def state_meta(self) -> dict[str, StateMeta]:
        return {**self.restored_meta, **{n: r.meta for n, r in self._registered.items()}}
