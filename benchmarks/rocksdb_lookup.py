"""What one point look-up in RocksDB costs through rocksdict, with sluice's options and without them (issue 36).

The merge-on-read index (docs/tables.md) looks up every changed key of a checkpoint in keyed state; on
the RocksDB backend that is one ``Rdict.get(list)`` of the batch's encoded keys. This script measures that
call alone, outside any job: ``--keys`` (10M) entries shaped as the index stores them (a 2-byte key group,
a state id, an 8-byte key, a 2-byte namespace; a 16-byte value) are written in sorted write batches and
compacted into one database per configuration, then ``--lookups`` (100k) random keys, sorted as the
backend sorts them, are read in one call, the configurations alternated over ``--rounds`` rounds with the
same keys per round (benchmarks/_common.py's rule for peers):

* ``sluice``: the options of sluice's RocksDB backend (``RocksResources``: LZ4, 4 KiB blocks, 16 Bloom bits
  a key, partitioned index and filters) with a ``--memory`` block cache (256 MiB, the default budget);
* ``no_compression``, ``block_1k``, ``cache_1g``: the same with one thing changed;
* ``dict`` and ``searchsorted``: the same look-ups in a Python ``dict`` of ``bytes`` and with
  ``numpy.searchsorted`` over a sorted ``uint64`` array of the keys: what an index outside RocksDB costs.

Every look-up's value is checked against the key it was written for. Reports the median and spread of
microseconds per key (CPU time of this process: the calls run on one thread) per configuration. Last line:
``RESULT {json}``.

Usage: python benchmarks/rocksdb_lookup.py [--keys 10000000] [--lookups 100000] [--rounds 3] [--memory-mb 256]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import rocksdict as rd
from sluice.state.rocksdb.resources import RocksResources

_PREFIX = b"\x00\x01" + b"\x05pk"  # key group 1, a state id
_SUFFIX = b"\x00\x00"  # the empty namespace
_BATCH = 500_000


def encode(ids: np.ndarray) -> list[bytes]:
    """The storage keys of ``ids`` (sorted ids give sorted keys)."""
    return [_PREFIX + i.to_bytes(8, "big") + _SUFFIX for i in ids.tolist()]


def value_of(i: int) -> bytes:
    return i.to_bytes(16, "big")


def options(name: str, memory: int) -> Any:
    """The options of configuration ``name``: sluice's, with one thing changed for the variants."""
    res = RocksResources(1 << 30 if name == "cache_1g" else memory, write_buffer_ratio=0.5)
    opts = res.options()
    if name == "no_compression":
        opts.set_compression_type(rd.DBCompressionType.none())
    if name == "block_1k":  # the table options again, as RocksResources builds them, with 1 KiB blocks
        table = rd.BlockBasedOptions()
        table.set_block_cache(res.cache)
        table.set_cache_index_and_filter_blocks(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        table.set_bloom_filter(res.bloom_bits_per_key, False)
        table.set_index_type(rd.BlockBasedIndexType.two_level_index_search())
        table.set_partition_filters(True)
        table.set_metadata_block_size(4096)
        table.set_pin_top_level_index_and_filter(True)
        table.set_block_size(1024)
        opts.set_block_based_table_factory(table)
    return opts


def build(path: Path, name: str, keys: int, memory: int) -> Any:
    db = rd.Rdict(str(path), options(name, memory))
    for start in range(0, keys, _BATCH):
        ids = np.arange(start, min(keys, start + _BATCH))
        wb = rd.WriteBatch(raw_mode=True)
        for k, i in zip(encode(ids), ids.tolist(), strict=True):
            wb.put(k, value_of(i))
        db.write(wb)
    db.flush()
    db.compact_range(None, None)
    return db


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=10_000_000)
    ap.add_argument("--lookups", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--memory-mb", type=int, default=256)
    args = ap.parse_args()
    memory = args.memory_mb << 20
    work = Path(tempfile.mkdtemp(prefix="rocksdb-lookup-"))
    dbs: dict[str, Any] = {}
    try:
        for name in ("sluice", "no_compression", "block_1k", "cache_1g"):
            t0 = time.perf_counter()
            dbs[name] = build(work / name, name, args.keys, memory)
            size = int(dbs[name].property_int_value("rocksdb.total-sst-files-size")) >> 20
            print(f"{name}: {args.keys:,} keys written and compacted in {time.perf_counter() - t0:.1f} s, {size} MiB of SST", flush=True)
        in_dict = {k: value_of(i) for i, k in enumerate(encode(np.arange(args.keys)))}
        sorted_ids = np.arange(args.keys, dtype=np.uint64)  # the keys' 8-byte parts, sorted

        def rocks(name: str) -> Callable[[list[bytes], np.ndarray], list[bytes | None]]:
            return lambda ks, ids: dbs[name].get(ks)

        def searchsorted(ks: list[bytes], ids: np.ndarray) -> list[bytes | None]:
            at = np.searchsorted(sorted_ids, ids.astype(np.uint64))
            return [value_of(int(i)) if sorted_ids[i] == v else None for i, v in zip(at.tolist(), ids.tolist(), strict=True)]

        ways: dict[str, Callable[[list[bytes], np.ndarray], list[Any]]] = {name: rocks(name) for name in dbs}
        ways["dict"] = lambda ks, ids: list(map(in_dict.get, ks))
        ways["searchsorted"] = searchsorted
        rng = np.random.default_rng(36)
        per_key: dict[str, list[float]] = {name: [] for name in ways}
        names = list(ways)
        for r in range(args.rounds + 1):  # round 0 warms the caches, untimed
            ids = np.sort(rng.choice(args.keys, args.lookups, replace=False))
            ks = encode(ids)
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                c0 = time.process_time()
                got = ways[name](ks, ids)
                cpu = time.process_time() - c0
                if got != [value_of(i) for i in ids.tolist()]:
                    raise SystemExit(f"{name}: a look-up returned a wrong value")
                if r:
                    per_key[name].append(cpu / args.lookups * 1e6)
                    print(f"  round {r}: {name:15s} {per_key[name][-1]:6.2f} us a key (CPU)", flush=True)
            # searchsorted's own cost, apart from building the Python values it returns
            c0 = time.process_time()
            np.searchsorted(sorted_ids, ids.astype(np.uint64))
            if r:
                per_key.setdefault("searchsorted_only", []).append((time.process_time() - c0) / args.lookups * 1e6)
        result: dict[str, Any] = {"keys": args.keys, "lookups": args.lookups, "rounds": args.rounds, "memory_mb": args.memory_mb}
        for name, xs in per_key.items():
            result[f"{name}_us"] = round(statistics.median(xs), 3)
            result[f"{name}_us_spread"] = [round(min(xs), 3), round(max(xs), 3)]
            print(f"{name}: median {statistics.median(xs):.2f} us a key, spread {min(xs):.2f}-{max(xs):.2f}")
        print("RESULT " + json.dumps(result))
    finally:
        for db in dbs.values():
            db.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
