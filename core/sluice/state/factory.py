"""The job's state backend from its :class:`~sluice.state.config.StateBackendConfig`."""

from __future__ import annotations

import threading

from sluice.state.config import StateBackendConfig
from sluice.state.spi import StateBackend

__all__ = ["create_state_backend", "state_backend_for"]


def create_state_backend(config: StateBackendConfig) -> StateBackend:
    """A :class:`~sluice.state.spi.StateBackend` for ``config`` (RocksDB's module is imported only here)."""
    if config.type == "rocksdb":
        from sluice.state.rocksdb import RocksDBStateBackend

        return RocksDBStateBackend(config)
    from sluice.state.hashmap import HashMapStateBackend

    return HashMapStateBackend(config)


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
