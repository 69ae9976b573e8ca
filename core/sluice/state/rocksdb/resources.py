"""rocksdict, imported lazily, and the memory one state backend's RocksDB instances share in a process.

The budget (``StateBackendConfig.memory``) is split in two. ``write_cache_ratio`` of it is the write-back
cache of entries in front of RocksDB (:mod:`sluice.state.rocksdb.cache`), shared equally by the instances
alive in the process. The rest is one LRU block cache; the write buffers (memtables) of every instance are
charged to it through one write buffer manager (``write_buffer_ratio`` of RocksDB's part), and index and
filter blocks live in the cache too, so the budget bounds what RocksDB and the cache hold in memory however
many key groups, states or instances there are (as Flink's ``state.backend.rocksdb.memory.fixed-per-slot``).

The compaction options are tuned for what a streaming job does: many writes, a checkpoint every second or
so, and each checkpoint flushes the memtables into a small L0 file that spans every key group (entries are
laid out key group first). With RocksDB's default L0 trigger (4 files) level compaction rewrites all of L1
every few seconds, which cost more CPU than the operator itself in the 10M-key deduplication benchmark
(docs/benchmarks.md). The figures behind each choice are in docs/state.md, *RocksDB options*.
"""

from __future__ import annotations

import threading
from typing import Any

from sluice.errors import ConfigError

__all__ = ["RocksResources", "rocksdict_module"]

_MB = 1 << 20
#: L0 files that start a compaction to L1 (RocksDB's default: 4). Each checkpoint flushes one small L0 file
#: spanning every key group, so every L0 -> L1 compaction rewrites all of L1: with 16 files it runs a quarter
#: as often (10M-key dedup job: 39 CPU-s instead of 55, with 16 Bloom bits; 8 files: 47). A read checks up
#: to this many L0 filters more, pinned in memory. Universal compaction (57 CPU-s) and no compression of
#: L0/L1 (no gain) were measured too and left out.
_L0_COMPACTION_TRIGGER = 16
#: bytes of one index or filter partition (RocksDB's default metadata_block_size)
_METADATA_BLOCK = 4096


def rocksdict_module() -> Any:
    """The ``rocksdict`` module, or a one-line ConfigError saying how to install it."""
    try:
        import rocksdict
    except ImportError:
        raise ConfigError(
            "state.backend.type rocksdb needs the rocksdb extra: pip install 'sluice-etl[rocksdb]'"
        ) from None
    return rocksdict


class RocksResources:
    """A block cache and a write buffer manager shared by the RocksDB instances of one state backend."""

    def __init__(
        self,
        memory: int,
        write_buffer_ratio: float,
        write_cache_ratio: float = 0.0,
        compaction_style: str = "level",
        bloom_bits_per_key: float = 16.0,
        partitioned_index_filters: bool = True,
    ) -> None:
        rd = rocksdict_module()
        self.memory = memory
        self.compaction_style = compaction_style
        self.bloom_bits_per_key = bloom_bits_per_key
        self.partitioned_index_filters = partitioned_index_filters
        #: bytes of the write-back caches of all instances together
        self.write_cache = int(memory * write_cache_ratio)
        self.block_cache = memory - self.write_cache
        self.cache = rd.Cache(self.block_cache)
        self.write_buffers = int(self.block_cache * write_buffer_ratio)
        # allow_stall: writes wait for a flush when the write buffers are full, so a slow disk or a busy CPU
        # delays writes instead of letting memtables grow past the budget
        self.write_buffer_manager = rd.WriteBufferManager.new_write_buffer_manager_with_cache(
            self.write_buffers, True, self.cache
        )
        self._lock = threading.Lock()
        self._instances = 0

    def options(self) -> Any:
        """Options for one instance: raw bytes, the shared cache and write buffer manager, no WAL files kept."""
        rd = rocksdict_module()
        opts = rd.Options(raw_mode=True)
        opts.create_if_missing(True)
        table = rd.BlockBasedOptions()
        table.set_block_cache(self.cache)
        table.set_cache_index_and_filter_blocks(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        # full (not block-based) filters; 16 bits per key rather than 10: ~0.05% false positives instead of
        # ~1%, and the keys a job looks up are often absent (deduplication: every new key), each false
        # positive a data block read. Not optimize_filters_for_hits, which drops the last level's filters:
        # lookups of absent keys would all read a block there.
        table.set_bloom_filter(self.bloom_bits_per_key, False)
        if self.partitioned_index_filters:
            # a point read loads one small index and filter partition instead of a file's whole index and
            # filter block. An SST of 10M keys has a 20 MB filter; in a block cache of a few hundred MB,
            # random reads of many keys evicted and reloaded it (the merge-on-read index of a 10M-row table:
            # 100k look-ups took 3.5 s, the whole pre-commit 0.8 s with partitions; docs/state.md)
            table.set_index_type(rd.BlockBasedIndexType.two_level_index_search())
            table.set_partition_filters(True)
            table.set_metadata_block_size(_METADATA_BLOCK)
            table.set_pin_top_level_index_and_filter(True)
        opts.set_block_based_table_factory(table)
        opts.set_write_buffer_manager(self.write_buffer_manager)
        opts.set_write_buffer_size(max(2 * _MB, min(64 * _MB, self.write_buffers // 4)))
        opts.set_max_write_buffer_number(3)
        opts.set_max_background_jobs(2)
        if self.compaction_style == "universal":
            opts.set_compaction_style(rd.DBCompactionStyle.universal())
        else:
            opts.set_level_zero_file_num_compaction_trigger(_L0_COMPACTION_TRIGGER)
            # writes slow down / stop at RocksDB's default distances above its default trigger
            opts.set_level_zero_slowdown_writes_trigger(_L0_COMPACTION_TRIGGER + 16)
            opts.set_level_zero_stop_writes_trigger(_L0_COMPACTION_TRIGGER + 32)
        opts.set_compression_type(rd.DBCompressionType.lz4())
        opts.set_keep_log_file_num(2)
        opts.set_max_log_file_size(_MB)
        return opts

    def write_options(self) -> Any:
        """Writes skip the WAL: durability comes from checkpoints, as in Flink."""
        rd = rocksdict_module()
        w = rd.WriteOptions()
        w.disable_wal = True
        return w

    def attach(self) -> None:
        """An instance now shares the write-back cache budget."""
        with self._lock:
            self._instances += 1

    def detach(self) -> None:
        """An instance was disposed."""
        with self._lock:
            self._instances = max(0, self._instances - 1)

    def write_cache_share(self) -> int:
        """The bytes one instance's write-back cache may hold now (0: no cache)."""
        return self.write_cache // max(1, self._instances)

    def usage(self) -> int:
        """Bytes the block cache holds now (write buffers included)."""
        return int(self.cache.get_usage())
