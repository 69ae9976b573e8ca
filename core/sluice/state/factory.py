"""The job's state backend from its :class:`~sluice.state.config.StateBackendConfig`."""

from __future__ import annotations

from sluice.state.config import StateBackendConfig
from sluice.state.spi import StateBackend

__all__ = ["create_state_backend"]


def create_state_backend(config: StateBackendConfig) -> StateBackend:
    """A :class:`~sluice.state.spi.StateBackend` for ``config`` (RocksDB's module is imported only here)."""
    if config.type == "rocksdb":
        from sluice.state.rocksdb import RocksDBStateBackend

        return RocksDBStateBackend(config)
    from sluice.state.hashmap import HashMapStateBackend

    return HashMapStateBackend(config)
