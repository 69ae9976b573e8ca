"""The RocksDB state backend (optional extra ``sluice-etl[rocksdb]``): keyed state in an embedded RocksDB per
operator subtask, incremental checkpoints of its files, rescaling by key-group ranges."""

from sluice.state.rocksdb.backend import RocksDBKeyedStateBackend, RocksDBStateBackend

__all__ = ["RocksDBKeyedStateBackend", "RocksDBStateBackend"]
