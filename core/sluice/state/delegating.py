"""A keyed backend that wraps another one: state access goes to the wrapped backend; checkpoints, restores
and notifications are the wrapper's to change.

The changelog backend (:mod:`sluice.state.changelog`) and local recovery
(:mod:`sluice.state.local_recovery`) are such wrappers, as Flink's ``ChangelogKeyedStateBackend`` wraps its
delegated backend.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from sluice.state.spi import BatchValueState, Handle, KeyedStateBackend, StateSnapshot, TimerService

if TYPE_CHECKING:
    from sluice.state.meta import StateMeta

__all__ = ["DelegatingKeyedStateBackend"]


class DelegatingKeyedStateBackend(KeyedStateBackend):
    """Forwards everything to ``delegate``; subclasses change what they need.

    Attributes:
        delegate: the wrapped keyed backend (it holds the state).
    """

    def __init__(self, delegate: KeyedStateBackend) -> None:
        super().__init__(delegate.key_groups, delegate.max_parallelism, delegate.transfer, delegate.paths, delegate.clock)
        self.delegate = delegate

    @property
    def innermost(self) -> KeyedStateBackend:
        """The backend that holds the state (under every wrapper)."""
        inner = self.delegate
        return inner.innermost if isinstance(inner, DelegatingKeyedStateBackend) else inner

    def set_current_key(self, key: Any, key_group: int, key_bytes: bytes | None = None) -> None:
        self.delegate.set_current_key(key, key_group, key_bytes)

    def set_current_namespace(self, namespace: bytes) -> None:
        self.delegate.set_current_namespace(namespace)

    @property
    def current_key(self) -> Any:
        return self.delegate.current_key

    @property
    def current_key_bytes(self) -> bytes:
        return self.delegate.current_key_bytes

    @property
    def current_key_group(self) -> int:
        return self.delegate.current_key_group

    def state(self, descriptor: Any) -> Any:
        return self.delegate.state(descriptor)

    def batch_state(self, descriptor: Any) -> BatchValueState:
        return self.delegate.batch_state(descriptor)

    def keys(self, name: str) -> Iterator[tuple[int, Any]]:
        return self.delegate.keys(name)

    def encoded_keys(self, name: str) -> Iterator[tuple[int, pa.Array]]:
        return self.delegate.encoded_keys(name)

    @property
    def timers(self) -> TimerService:
        return self.delegate.timers

    def cleanup_expired(self, max_entries: int) -> int:
        return self.delegate.cleanup_expired(max_entries)

    def drop_state(self, name: str) -> None:
        self.delegate.drop_state(name)

    def state_meta(self) -> dict[str, StateMeta]:
        return self.delegate.state_meta()

    def materialize_if_due(self) -> None:
        self.delegate.materialize_if_due()

    def materialize(self) -> Future[Any] | None:
        return self.delegate.materialize()

    def snapshot(self, checkpoint_id: int, savepoint: bool = False) -> StateSnapshot:
        return self.delegate.snapshot(checkpoint_id, savepoint)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.delegate.notify_checkpoint_complete(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self.delegate.notify_checkpoint_aborted(checkpoint_id)

    def restore(self, handles: Sequence[Handle]) -> None:
        self.delegate.restore(handles)

    def restore_metrics(self) -> dict[str, int]:
        return self.delegate.restore_metrics()

    def dispose(self) -> None:
        self.delegate.dispose()
