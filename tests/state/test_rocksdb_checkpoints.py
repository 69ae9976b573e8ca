"""RocksDB incremental checkpoints: what is uploaded, what is reused and when, files checked by SHA-256 on
restore, and shared files deleted through the shared-state registry exactly when no retained checkpoint
uses them."""

from __future__ import annotations

import configparser
import importlib.util
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from sluice.errors import ConfigError, RestoreError
from sluice.state.api import ValueStateDescriptor
from sluice.state.config import StateBackendConfig
from sluice.state.shared_registry import SharedStateRegistry, shared_refs
from sluice.state.spi import Handle, KeyedStateBackend
from sluice.state.transfer import LocalFileTransfer

from tests.state.conftest import MakeBackend

COUNT = ValueStateDescriptor("count", serializer="int64")


def write(be: KeyedStateBackend, keys: range, value: int) -> None:
    be.batch_state(COUNT).put(be.key_batch([pa.array(keys, pa.int64())]), pa.array([value] * len(keys), pa.int64()))


def read(be: KeyedStateBackend, keys: Sequence[int]) -> list[Any]:
    return be.batch_state(COUNT).get(be.key_batch([pa.array(keys, pa.int64())])).to_pylist()


def uploaded(handle: Handle) -> int:
    """Bytes a checkpoint's asynchronous part uploaded (new shared files and private files)."""
    new = sum(r["size"] for r in handle["shared"].values() if not r["placeholder"])
    return new + sum(r["size"] for r in handle["private"].values())


def total(handle: Handle) -> int:
    return sum(r["size"] for r in handle["shared"].values()) + sum(r["size"] for r in handle["private"].values())


def test_incremental_checkpoint_uploads_only_files_the_last_completed_one_has_not(make_backend: MakeBackend) -> None:
    be = make_backend("rocksdb", incremental=True)
    write(be, range(100_000), 1)
    first = be.snapshot(1).run()
    assert first["shared"] and not any(r["placeholder"] for r in first["shared"].values())
    assert {"CURRENT", "OPTIONS"} <= {n.split("-")[0] for n in first["private"]}
    be.notify_checkpoint_complete(1)
    write(be, range(0, 100_000, 100), 2)  # 1% of the keys change
    second = be.snapshot(2).run()
    reused = {n for n, r in second["shared"].items() if r["placeholder"]}
    assert reused and all(second["shared"][n]["path"] == first["shared"][n]["path"] for n in reused)
    assert uploaded(second) < 0.2 * total(second)
    assert set(second["private"]) >= {"CURRENT"}  # the small files go every time


def test_only_uploads_confirmed_by_a_completed_checkpoint_are_reused(make_backend: MakeBackend) -> None:
    be = make_backend("rocksdb", incremental=True)
    write(be, range(10_000), 1)
    first = be.snapshot(1).run()
    write(be, range(100), 2)
    second = be.snapshot(2).run()  # checkpoint 1 is not confirmed yet (FLINK-25395): nothing is reused
    assert not any(r["placeholder"] for r in second["shared"].values())
    assert {r["path"] for r in second["shared"].values()}.isdisjoint(r["path"] for r in first["shared"].values())
    be.notify_checkpoint_complete(1)
    be.notify_checkpoint_aborted(2)
    write(be, range(100), 3)
    third = be.snapshot(3).run()
    reused = {r["path"] for r in third["shared"].values() if r["placeholder"]}
    assert reused and reused <= {r["path"] for r in first["shared"].values()}  # never checkpoint 2's uploads
    be.notify_checkpoint_complete(3)
    fourth = be.snapshot(4).run()
    assert {r["path"] for r in fourth["shared"].values() if r["placeholder"]} == {r["path"] for r in third["shared"].values()}


def test_full_checkpoints_when_incremental_is_off(make_backend: MakeBackend) -> None:
    be = make_backend("rocksdb", incremental=False)
    write(be, range(5000), 1)
    be.snapshot(1).run()
    be.notify_checkpoint_complete(1)
    second = be.snapshot(2).run()
    assert second["shared"] == {} and any(n.endswith(".sst") for n in second["private"])
    restored = make_backend("rocksdb")
    restored.restore([second])
    assert read(restored, range(0, 5000, 999)) == [1] * 6


def test_restore_checks_every_file_against_its_sha256(make_backend: MakeBackend, storage: LocalFileTransfer) -> None:
    be = make_backend("rocksdb", incremental=True)
    write(be, range(5000), 7)
    handle = be.snapshot(1).run()
    sst = next(iter(handle["shared"].values()))["path"]
    path = storage.root / sst
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(RestoreError, match=r"does not match its checkpoint's SHA-256") as info:
        make_backend("rocksdb").restore([handle])
    assert sst in str(info.value) and "\n" not in str(info.value)
    path.unlink()
    with pytest.raises(RestoreError, match="is missing from checkpoint storage"):
        make_backend("rocksdb").restore([handle])


def test_a_restored_backend_reuses_the_restored_files(make_backend: MakeBackend) -> None:
    be = make_backend("rocksdb", incremental=True)
    write(be, range(20_000), 1)
    handle = be.snapshot(1).run()
    restored = make_backend("rocksdb", incremental=True)
    restored.restore([handle])
    write(restored, range(10), 2)
    after = restored.snapshot(2).run()
    reused = {r["path"] for r in after["shared"].values() if r["placeholder"]}
    assert reused == {r["path"] for r in handle["shared"].values()}
    assert read(restored, range(8, 12)) == [2, 2, 1, 1]


def test_shared_files_are_deleted_exactly_when_no_retained_checkpoint_uses_them(
    make_backend: MakeBackend, storage: LocalFileTransfer
) -> None:
    """A job's life with num_retained=2: L0 files pile up and are compacted away; the registry deletes a
    shared file when the last retained checkpoint that references it is subsumed, and the oldest retained
    checkpoint always still restores."""
    be = make_backend("rocksdb", incremental=True)
    registry, retained, deleted = SharedStateRegistry(), [], set()
    handles: dict[int, Handle] = {}
    cid, deadline = 0, time.monotonic() + 120
    # past the L0 compaction trigger (16 flushed files), then until a compaction has replaced files
    while cid < 20 or not deleted:
        assert time.monotonic() < deadline, "no compaction replaced a checkpointed file"
        if cid > 16:
            time.sleep(0.05)  # let the background compaction run
        cid += 1
        write(be, range(cid * 1000, cid * 1000 + 3000), cid)
        handles[cid] = be.snapshot(cid).run()
        registry.register_checkpoint(cid, shared_refs([handles[cid]]))
        retained.append(cid)
        if len(retained) > 2:
            retained.pop(0)
        for path in registry.unregister_unused(min(retained)):
            in_use = {r.path for c in retained for r in shared_refs([handles[c]])}
            assert path not in in_use
            storage.delete(path)
            deleted.add(path)
        be.notify_checkpoint_complete(cid)
        referenced = {r.path for c in retained for r in shared_refs([handles[c]])}
        assert set(storage.list("shared")) == referenced  # nothing leaks, nothing referenced is gone
    assert deleted  # compaction replaced files, so some were deleted on the way
    oldest = make_backend("rocksdb")
    oldest.restore([handles[retained[0]]])
    assert retained[0] == cid - 1
    assert read(oldest, range(retained[0] * 1000, retained[0] * 1000 + 2)) == [retained[0]] * 2


def test_the_memory_budget_bounds_the_block_cache_and_the_write_cache(make_backend: MakeBackend) -> None:
    be: Any = make_backend("rocksdb", memory="32 mb", write_cache_ratio=0.25)
    res = be.resources
    assert res.memory == 32 << 20 and res.write_cache == 8 << 20 and res.block_cache == 24 << 20
    assert res.write_buffers == 12 << 20  # write_buffer_ratio of RocksDB's part
    for i in range(5):
        write(be, range(i * 40_000, (i + 1) * 40_000), i)
        assert be.cache.measure() <= res.write_cache_share() == 8 << 20
    assert read(be, range(0, 200_000, 7)) == [k // 40_000 for k in range(0, 200_000, 7)]
    assert be.cache.measure() <= 8 << 20
    assert 0 < res.usage() <= 24 << 20


def test_the_rocksdb_extra_is_named_when_rocksdict_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "rocksdict" else real(name, *a))
    with pytest.raises(ConfigError, match=r"pip install 'sluice-etl\[rocksdb\]'") as info:
        StateBackendConfig(type="rocksdb")
    assert "\n" not in str(info.value)
    monkeypatch.setattr(importlib.util, "find_spec", real)
    monkeypatch.setitem(sys.modules, "rocksdict", None)
    from sluice.state.rocksdb.resources import rocksdict_module

    with pytest.raises(ConfigError, match=r"sluice-etl\[rocksdb\]"):
        rocksdict_module()


def test_dispose_removes_the_local_files(make_backend: MakeBackend, tmp_path: Path) -> None:
    be: Any = make_backend("rocksdb")
    write(be, range(100), 1)
    root = be.root
    assert os.path.isdir(root)
    be.dispose()
    assert not os.path.exists(root)


@pytest.mark.parametrize(("before", "after"), [("level", "universal"), ("universal", "level")])
def test_a_checkpoint_restores_under_the_other_compaction_style(make_backend: MakeBackend, before: str, after: str) -> None:
    """A job can change state.backend.rocksdb.compaction.style across a restore: RocksDB opens the other
    style's files (level's L0 and L1, universal's sorted runs) and compacts them its own way."""
    be = make_backend("rocksdb", incremental=True, compaction_style=before)
    for i in range(12):  # more flushed files than either style's compaction trigger
        write(be, range(i * 5000, (i + 1) * 5000), 1)
        be.snapshot(i + 1).run()
        be.notify_checkpoint_complete(i + 1)
    write(be, range(0, 60_000, 100), 2)
    last = be.snapshot(13).run()
    restored = make_backend("rocksdb", incremental=True, compaction_style=after)
    restored.restore([last])
    assert read(restored, [0, 1, 59_900, 59_999]) == [2, 1, 2, 1]
    write(restored, range(60_000, 70_000), 3)
    restored.snapshot(14).run()
    assert read(restored, [0, 65_000]) == [2, 3]


def _rocksdb_options(be: Any, section: str) -> dict[str, str]:
    """One section (``TableOptions/BlockBasedTable``, ``CFOptions``) of the options RocksDB wrote into the
    database's newest OPTIONS file: what the database runs with."""
    newest = max(Path(be._db_path).glob("OPTIONS-*"), key=lambda p: int(p.name.split("-")[1]))
    parsed = configparser.ConfigParser(interpolation=None)
    parsed.read_string(newest.read_text())
    return dict(parsed[next(name for name in parsed.sections() if name.startswith(section))])


def _table_options(be: Any) -> dict[str, str]:
    return _rocksdb_options(be, "TableOptions/BlockBasedTable")


@pytest.mark.parametrize(("before", "after"), [(True, False), (False, True)])
def test_partitioned_index_filters_reach_rocksdb_and_a_checkpoint_restores_across_the_switch(
    make_backend: MakeBackend, before: bool, after: bool
) -> None:
    """state.backend.rocksdb.memory.partitioned-index-filters sets RocksDB's index type and filter
    partitioning (read back from the OPTIONS file RocksDB writes), and files written one way are read the other
    way after a restore (the table format records its index type per file)."""
    be = make_backend("rocksdb", incremental=True, partitioned_index_filters=before)
    opts = _table_options(be)
    assert opts["index_type"] == ("kTwoLevelIndexSearch" if before else "kBinarySearch")
    assert opts["partition_filters"] == str(before).lower()
    assert opts["pin_top_level_index_and_filter"] == "true"  # RocksDB's default too: only used with partitions
    write(be, range(50_000), 1)
    last = be.snapshot(1).run()
    restored = make_backend("rocksdb", incremental=True, partitioned_index_filters=after)
    restored.restore([last])
    assert _table_options(restored)["index_type"] == ("kTwoLevelIndexSearch" if after else "kBinarySearch")
    assert read(restored, [0, 25_000, 49_999, 50_000]) == [1, 1, 1, None]


@pytest.mark.parametrize(("before", "after"), [("level", "universal"), ("universal", "level")])
def test_a_restored_database_runs_with_the_options_and_memory_budget_of_the_restoring_job(
    make_backend: MakeBackend, before: str, after: str
) -> None:
    """A restore opens the checkpoint's folder, which holds the OPTIONS file of the job that wrote it. The
    database must run with the restoring job's options, not that file's: the shared block cache of the memory
    budget (not RocksDB's default 8 MB cache of its own), its compaction style and table options."""
    be = make_backend("rocksdb", incremental=True, compaction_style=before, memory="96 mb")
    write(be, range(20_000), 1)
    last = be.snapshot(1).run()
    restored = make_backend("rocksdb", incremental=True, compaction_style=after, memory="160 mb",
                            partitioned_index_filters=False)  # fmt: skip
    restored.restore([last])
    budget = restored.resources.block_cache  # type: ignore[attr-defined]
    assert restored.db.property_int_value("rocksdb.block-cache-capacity") == budget > 100 << 20  # type: ignore[attr-defined]
    assert _rocksdb_options(restored, "CFOptions")["compaction_style"] == f"kCompactionStyle{after.capitalize()}"
    assert _table_options(restored)["partition_filters"] == "false"
    assert read(restored, [0, 19_999]) == [1, 1]
