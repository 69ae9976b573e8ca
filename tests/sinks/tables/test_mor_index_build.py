"""The merge-on-read index built from an existing table (``rebuild_index``), compared with the table read apart
from the index code (each data file's ids with pyarrow minus the positions its delete files name:
``tests.sinks.tables.mor.live_rows``), on both state backends and for a subtask owning part of the key
groups; a key the table holds twice is refused naming the file. A commit that was pending when the table
changed behind the job is refused naming what to do (its staged deletes are positions in rewritten files)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from sluice.errors import ConfigError
from sluice.sinks.iceberg.mor.committer import MergeOnReadCommitter
from sluice.sinks.iceberg.mor.positions import INDEX, index_descriptor, unpack
from sluice.sinks.iceberg.mor.writer import MergeOnReadWriter, rebuild_index
from sluice.sinks.tables.changes import ChangeError, Op, change_table
from sluice.state.config import StateBackendConfig
from sluice.state.factory import state_backend_for
from sluice.state.keygroups import KeyGroupRange
from sluice.state.spi import KeyBatch, KeyedStateBackend
from sluice.state.transfer import LocalFileTransfer

from tests.sinks.tables.helpers import Target
from tests.sinks.tables.mor import MOR, live_rows, orphan_deletes
from tests.sinks.tables.upserts import ROW_SCHEMA, Upserts

MAX_PAR = 128


class _Ctx:
    """One writer subtask's context (the key groups are its backend's) and the committer's job."""

    subtask, parallelism, attempt = 0, 1, 0
    job_id, sink_uid = "index-build", "sink"
    restored_checkpoint_id: int | None = None

    def __init__(self, backend: KeyedStateBackend) -> None:
        self.backend = backend
        self.metrics: dict[str, int] = {}

    def metric(self, name: str, increment: int = 1) -> None:
        self.metrics[name] = self.metrics.get(name, 0) + increment

    def gauge(self, name: str, value: float) -> None:
        pass

    def fault_hook(self, point: str) -> None:
        pass

    def keyed_state(self) -> KeyedStateBackend:
        return self.backend


def _backend(kind: str, groups: KeyGroupRange) -> KeyedStateBackend:
    return state_backend_for(StateBackendConfig(type=kind)).create_keyed_backend(
        "index-build", groups, MAX_PAR, LocalFileTransfer(tempfile.mkdtemp()), None
    )


def _rows(ids: list[int], version: int) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "name": [f"v{version}-{i}" for i in ids],
                     "amount": pa.array([float(i + version) for i in ids])}, schema=ROW_SCHEMA)  # fmt: skip


def _table_with_deletes(tmp: Path, kind: str) -> Target:
    """Three appends of 300 ids, then two merge-on-read checkpoints (updates, deletes, inserts): data files
    with position-delete files naming several of them."""
    t = Target("iceberg", str(tmp / "lake"), {}, str(tmp))
    table = Upserts(t).load_iceberg(ROW_SCHEMA)
    for start in (0, 300, 600):
        table.append(_rows(list(range(start, start + 300)), 0))
    backend = _backend(kind, KeyGroupRange(0, MAX_PAR))
    ctx = _Ctx(backend)
    sink = t.sink(mode="upsert", rebuild_index=True, **MOR)  # a table with rows: the index built first
    writer, committer = MergeOnReadWriter(sink.options, ctx), MergeOnReadCommitter(sink.options, ctx)  # type: ignore[arg-type]
    assert rebuild_index(writer, committer.load(), [pa.int64()]) == 900
    writer._rebuild = False
    rng = np.random.default_rng(3)
    for cid in (1, 2):
        picked = rng.choice(900, 120, replace=False).tolist()
        ids = [*picked, *range(900 + 50 * cid, 950 + 50 * cid)]
        ops = [Op.UPDATE] * 90 + [Op.DELETE] * 30 + [Op.INSERT] * 50
        writer.write(change_table(_rows(ids, cid), [int(o) for o in ops], list(range(len(ids)))).to_batches()[0])
        assert committer.commit(cid, writer.prepare_commit(cid)).value == "committed"
    committer.close()
    backend.dispose()
    return t


def _index(writer: MergeOnReadWriter) -> dict[int, tuple[int, int]]:
    keys = [int(k) for _, k in writer.backend.keys(INDEX)]
    if not keys:
        return {}
    batch = KeyBatch.of([pa.array(keys, pa.int64())], MAX_PAR)
    present, files, positions = unpack(writer.backend.batch_state(index_descriptor()).get(batch))
    assert present.all()
    return dict(zip(keys, zip(files.tolist(), positions.tolist(), strict=True), strict=True))


def _writer(t: Target, backend: KeyedStateBackend) -> MergeOnReadWriter:
    return MergeOnReadWriter(t.sink(mode="upsert", **MOR).options, _Ctx(backend))  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["rocksdb", "hashmap"])
def test_the_index_built_from_a_table_with_deletes_is_the_tables_live_rows(tmp_path: Path, kind: str) -> None:
    t = _table_with_deletes(tmp_path, kind)
    table = t.iceberg_table()
    assert any(task.delete_files for task in table.scan().plan_files()), "no delete file to subtract"
    live = live_rows(t)
    assert sorted(live) == sorted(table.scan().to_arrow().column("id").to_pylist())  # pyiceberg agrees
    for groups in (KeyGroupRange(0, MAX_PAR), KeyGroupRange(40, 90)):
        writer = _writer(t, _backend(kind, groups))
        try:
            entries = rebuild_index(writer, t.iceberg_table(), None)
            ids = pa.array(sorted(live), pa.int64())
            kgs = KeyBatch.of([ids], MAX_PAR).key_groups
            mine = {k: live[k] for k, g in zip(ids.to_pylist(), kgs.tolist(), strict=True) if groups.start <= g < groups.end}
            assert 0 < len(mine) and entries == len(mine)
            assert _index(writer) == mine
        finally:
            writer.backend.dispose()


@pytest.mark.parametrize("twice", ["across files", "in one file"])
def test_a_key_held_twice_is_refused_naming_the_file(tmp_path: Path, twice: str) -> None:
    t = Target("iceberg", str(tmp_path / "lake"), {}, str(tmp_path))
    table = Upserts(t).load_iceberg(ROW_SCHEMA)
    table.append(_rows(list(range(100)), 0))
    table.append(_rows([500, 7] if twice == "across files" else [500, 501, 500], 1))
    added = {task.file.file_path for task in table.refresh().scan().plan_files()}
    writer = _writer(t, _backend("rocksdb", KeyGroupRange(0, MAX_PAR)))
    with pytest.raises(ChangeError, match="holds a key twice") as refused:
        rebuild_index(writer, t.iceberg_table(), None)
    writer.backend.dispose()
    assert any(path in str(refused.value) for path in added) and "deduplicate" in str(refused.value)
    assert len(str(refused.value).splitlines()) == 1
    # the same rows once each: built
    other = Target("iceberg", str(tmp_path / "lake2"), {}, str(tmp_path / "two"))
    (tmp_path / "two").mkdir()
    table = Upserts(other).load_iceberg(ROW_SCHEMA)
    table.append(_rows(list(range(100)), 0))
    table.append(_rows([500, 501], 1))
    built = _writer(other, _backend("rocksdb", KeyGroupRange(0, MAX_PAR)))
    assert rebuild_index(built, other.iceberg_table(), None) == 102 and _index(built) == live_rows(other)
    built.backend.dispose()


def test_a_commit_pending_when_the_table_changed_is_refused_naming_what_to_do(tmp_path: Path) -> None:
    # checkpoint 2's old positions are staged (pre-commit done, commit pending) when another writer rewrites
    # every row into new files: the staged positions name rows of files the table no longer holds and the
    # staged file carries no keys to find those rows again, so a restored attempt (rebuild_index=True) must
    # refuse the commit, in one line naming what to do, and commit nothing
    t = _table_with_deletes(tmp_path, "hashmap")
    backend = _backend("hashmap", KeyGroupRange(0, MAX_PAR))
    sink = t.sink(mode="upsert", rebuild_index=True, **MOR)
    ctx = _Ctx(backend)
    writer = MergeOnReadWriter(sink.options, ctx)  # type: ignore[arg-type]
    rebuild_index(writer, t.iceberg_table(), [pa.int64()])
    writer._rebuild = False
    ids = sorted(live_rows(t))[:40]
    writer.write(change_table(_rows(ids, 3), [int(Op.UPDATE)] * 40, list(range(40))).to_batches()[0])
    staged = writer.prepare_commit(3)
    table = t.iceberg_table()
    table.overwrite(table.scan().to_arrow())  # another writer: the same rows, in new files at new positions
    before = t.iceberg_table().current_snapshot().snapshot_id
    ctx.attempt, ctx.restored_checkpoint_id = 1, 3  # the restored attempt commits the pending checkpoint
    committer = MergeOnReadCommitter(sink.options, ctx)  # type: ignore[arg-type]
    try:
        with pytest.raises(Exception, match="no longer holds") as refused:
            committer.commit(3, staged)
    finally:
        committer.close()
        backend.dispose()
    text = str(refused.value)
    assert "\n" not in text and "rebuild_index=True" in text and "allow_reprocessing=True" in text, text
    assert "pending" in text and "checkpoint 3" in text and "positions, not keys" in text, text  # why
    assert isinstance(refused.value, ConfigError)  # a restart cannot cure it: the job fails at once
    assert t.iceberg_table().current_snapshot().snapshot_id == before  # nothing committed
    assert not orphan_deletes(t), "the refused commit left position-delete files behind"
