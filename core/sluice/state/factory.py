"""The job's state backend from its :class:`~sluice.state.config.StateBackendConfig`.

With changelog checkpoints or local recovery on, each keyed backend is the built-in one wrapped: local
recovery (outermost) around changelog around hashmap or RocksDB, and the transfer keeps local copies.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from sluice.state.config import StateBackendConfig
from sluice.state.keygroups import KeyGroupRange
from sluice.state.spi import KeyedStateBackend, StateBackend
from sluice.state.transfer import FileTransfer

__all__ = ["LayeredStateBackend", "create_state_backend", "state_backend_for"]


def create_state_backend(config: StateBackendConfig) -> StateBackend:
    """A :class:`~sluice.state.spi.StateBackend` for ``config`` (RocksDB's module is imported only here)."""
    base: StateBackend
    if config.type == "rocksdb":
        from sluice.state.rocksdb import RocksDBStateBackend

        base = RocksDBStateBackend(config)
    else:
        from sluice.state.hashmap import HashMapStateBackend

        base = HashMapStateBackend(config)
    if config.changelog or config.local_recovery:
        return LayeredStateBackend(base)
    return base


class LayeredStateBackend(StateBackend):
    """A built-in backend (``base``) whose keyed backends get changelog checkpoints and/or local recovery.

    Attributes:
        base: the hashmap or RocksDB state backend.
    """

    def __init__(self, base: StateBackend) -> None:
        super().__init__(base.config)
        self.base = base

    def create_keyed_backend(
        self,
        owner: str,
        key_groups: KeyGroupRange,
        max_parallelism: int,
        transfer: FileTransfer,
        clock: Callable[[], int] | None = None,
    ) -> KeyedStateBackend:
        config = self.config
        store = None
        if config.local_recovery:
            from sluice.state.local_recovery import (
                LocalRecoveryTransfer,
                LocalStateStore,
                local_recovery_root,
            )

            store = LocalStateStore(local_recovery_root(config, owner, transfer))
            transfer = LocalRecoveryTransfer(transfer, store)
        keyed = self.base.create_keyed_backend(owner, key_groups, max_parallelism, transfer, clock)
        if config.changelog:
            from sluice.state.changelog import ChangelogKeyedStateBackend

            keyed = ChangelogKeyedStateBackend(keyed, config)
        if store is not None:
            from sluice.state.local_recovery import LocalRecoveryKeyedStateBackend

            keyed = LocalRecoveryKeyedStateBackend(keyed, store)
        return keyed


_PROCESS_BACKENDS: dict[str, StateBackend] = {}
_PROCESS_LOCK = threading.Lock()


def state_backend_for(config: StateBackendConfig) -> StateBackend:
    """The state backend of ``config`` in this process, made once: every operator subtask the process hosts
    (a thread of the in-process runtime, a Spark slot) shares it, so RocksDB's memory budget (block cache,
    write buffer manager) is one per process and backend configuration. The configuration travels with the
    job; a backend's native resources are made where it runs, never pickled."""
    key = config.model_dump_json()
    with _PROCESS_LOCK:
        backend = _PROCESS_BACKENDS.get(key)
        if backend is None:
            backend = _PROCESS_BACKENDS[key] = create_state_backend(config)
        return backend
