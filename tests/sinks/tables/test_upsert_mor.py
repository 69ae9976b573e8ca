"""Iceberg merge-on-read upserts: the snapshots a job commits (row deltas of data files and position-delete
files written by the spec), the index's lineage (a table changed behind the job is refused in one line, or
the index rebuilt from it on request; a job starting on a table with rows needs the rebuild), options, and
the pyiceberg internals the row delta is committed through."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sluice.errors import ConfigError
from sluice.sinks.iceberg import IcebergSink
from sluice.sinks.iceberg.mor.deletes import PATH_ID, POS_ID
from sluice.sinks.iceberg.mor.snapshot import check_pyiceberg

from tests.iceberg_spark import spark_snapshots
from tests.sinks.tables.cdc import Stream, check_versions, pipeline, replay, table_state, version_states
from tests.sinks.tables.helpers import Target
from tests.sinks.tables.mor import MOR, check_index, index_in_checkpoint, orphan_deletes
from tests.sinks.tables.paced import Paced

STREAM = Stream(splits=2, per_split=200, batch=20)


def target(tmp: Path) -> Target:
    return Target("iceberg", str(tmp / "lake"), {}, str(tmp))


def run(t: Target, tmp: Path, stream: Stream = STREAM, faults: Any = None, attempts: int = 4, restore: str = "none",
        checkpoint: dict[str, Any] | None = None, **sink: Any) -> Any:  # fmt: skip
    # paced by checkpoints: two batches a checkpoint, so every run commits several snapshots however loaded
    source = Paced(num_splits=stream.splits, records_per_split=stream.per_split, batch_size=stream.batch,
                   rows=stream.rows(), name="changes", chunk_batches=2)  # fmt: skip
    p = pipeline(stream, t.sink(mode="upsert", **{**MOR, **sink}), str(tmp), parallelism=2, attempts=attempts,
                 checkpoint=checkpoint, source=source)  # fmt: skip
    try:
        return p.run(runtime="local", restore=restore, faults=faults)
    except Exception as exc:  # asserted by the caller
        return exc


def test_each_checkpoint_commits_new_rows_and_position_deletes_that_readers_apply(tmp_path: Path) -> None:
    t = target(tmp_path)
    result = run(t, tmp_path, partition_by=["bucket(2, id)"])
    assert not isinstance(result, Exception), result
    assert table_state(t.read()) == STREAM.final()
    assert check_versions(STREAM, t) > 3  # every snapshot pyiceberg reads is a per-split prefix of the stream
    table = t.iceberg_table()
    ops = {s.summary.operation.value for s in table.snapshots() if s.summary is not None}
    assert "overwrite" in ops  # new rows and deletes of the old ones in one snapshot
    deletes = [d for task in table.scan().plan_files() for d in task.delete_files]
    assert deletes, "no position-delete file in the table"
    for d in deletes:  # the spec's layout: required file_path and pos with the reserved ids, sorted
        rows = pq.read_table(d.file_path.removeprefix("file://"))
        ids = [int(f.metadata[b"PARQUET:field_id"]) for f in rows.schema]
        assert ids == [PATH_ID, POS_ID] and not any(f.nullable for f in rows.schema)
        assert rows.to_pylist() == sorted(rows.to_pylist(), key=lambda r: (r["file_path"], r["pos"]))
        assert d.spec_id == table.spec().spec_id
    check_index(t, index_in_checkpoint(f"{tmp_path}/chk", "cdc"))
    assert orphan_deletes(t) == []
    assert t.read_independently().num_rows == len(STREAM.final())  # Polars applies the deletes too


def test_spark_with_the_iceberg_runtime_reads_what_pyiceberg_reads_at_every_snapshot(tmp_path: Path) -> None:
    """Every snapshot (checkpoint commits with position deletes, rewrites that folded them) read by Spark with
    the Iceberg runtime from Maven, apart from pyiceberg: the same rows, each a per-split prefix of the
    changes (checked on pyiceberg's read by ``check_versions``), the last the replay of all of them."""
    t = target(tmp_path)
    result = run(t, tmp_path, partition_by=["bucket(2, id)"], rewrite={"every": 2, "min_files": 2})
    assert not isinstance(result, Exception), result
    assert check_versions(STREAM, t) > 3
    assert t.rewrites() >= 1, "no rewrite committed: the test would not read folded deletes"
    table = t.iceberg_table()
    snapshots = [s.snapshot_id for s in table.snapshots()]
    with_deletes = [s for s in snapshots if any(task.delete_files for task in table.scan(snapshot_id=s).plan_files())]
    assert with_deletes, "no snapshot with position deletes"
    spark = spark_snapshots(table.metadata_location, snapshots, ["id", "name", "amount"])
    pyiceberg = {s: table_state(table.scan(snapshot_id=s).to_arrow()) for s in snapshots}
    for s in snapshots:
        rows = spark[s]
        assert len({r[0] for r in rows}) == len(rows), f"snapshot {s}: Spark reads a key twice"
        assert {r[0]: (r[1], r[2]) for r in rows} == pyiceberg[s], f"snapshot {s}: Spark and pyiceberg differ"
    assert pyiceberg[snapshots[-1]] == STREAM.final()


def test_a_table_changed_behind_the_job_is_refused_and_the_index_rebuilt_on_request(tmp_path: Path) -> None:
    t = target(tmp_path)
    # the job finishes (no commit pending: a checkpoint staged before the table changed cannot be placed, a
    # one-line refusal even with rebuild_index=True, see docs/tables.md), then the table changes
    first = run(t, tmp_path)
    assert not isinstance(first, Exception), first
    table = t.iceberg_table()
    table.overwrite(table.scan().to_arrow())  # another writer: the same rows, in new files at new positions
    refused = run(t, tmp_path, restore="latest")
    assert isinstance(refused, Exception)
    assert "changed behind the merge-on-read index" in str(refused) and "rebuild_index=True" in str(refused)
    assert len(str(refused).splitlines()) == 1
    # nothing left to read: the writers rebuild the index at their first pre-commit all the same (the
    # checkpoint held the stale one before)
    rebuilt = run(t, tmp_path, restore="latest", rebuild_index=True)
    assert not isinstance(rebuilt, Exception), rebuilt
    assert table_state(t.read()) == STREAM.final()
    check_index(t, index_in_checkpoint(f"{tmp_path}/chk", "cdc"))


def test_a_job_starting_on_a_table_with_rows_needs_the_index_rebuilt(tmp_path: Path) -> None:
    from sluice.sinks.iceberg.catalog import open_or_create

    t = target(tmp_path)
    rows = pa.table({"id": pa.array([0, 1, 5000], pa.int64()), "name": ["x0", "x1", "x5000"], "amount": [1.0, 2.0, 3.0]})
    table = open_or_create(t.sink().options, rows.schema)  # another writer's table: keys the stream changes and not
    assert table is not None
    table.append(rows)
    state = {0: ("x0", 1.0), 1: ("x1", 2.0), 5000: ("x5000", 3.0)}
    refused = run(t, tmp_path)
    assert isinstance(refused, Exception) and "rebuild_index=True" in str(refused), refused
    assert len(str(refused).splitlines()) == 1
    result = run(t, tmp_path / "second", rebuild_index=True)
    assert not isinstance(result, Exception), result
    for split in range(STREAM.splits):
        replay(state, STREAM.split_changes(split))
    assert table_state(t.read()) == state
    check_index(t, index_in_checkpoint(f"{tmp_path}/second/chk", "cdc"))


def test_restoring_a_checkpoint_older_than_the_tables_newest_commit_is_refused(tmp_path: Path) -> None:
    t = target(tmp_path)
    result = run(t, tmp_path, checkpoint={"num_retained": 12})
    assert not isinstance(result, Exception), result
    newest = [cid for cid, _ in version_states(t) if cid is not None][-1]  # the last checkpoint with changes
    retained = [int(p.name[4:]) for p in (tmp_path / "chk" / "cdc").glob("chk-*")]
    older = max(c for c in retained if c < newest)  # its index describes the table before ``newest``'s commit
    refused = run(t, tmp_path, restore=str(tmp_path / "chk" / "cdc" / f"chk-{older}"))
    assert isinstance(refused, Exception), refused
    assert "already holds checkpoint" in str(refused)  # the index of an older checkpoint is never used
    assert [cid for cid, _ in version_states(t) if cid is not None][-1] == newest


def test_options_are_checked_when_the_sink_is_built(tmp_path: Path) -> None:
    wh = str(tmp_path / "wh")
    with pytest.raises(ConfigError, match="write_mode must be one of copy-on-write, merge-on-read"):
        IcebergSink("db.t", warehouse=wh, mode="upsert", key_columns=["id"], write_mode="mor")
    with pytest.raises(ConfigError, match="write_mode is for mode='upsert' only"):
        IcebergSink("db.t", warehouse=wh, write_mode="merge-on-read")
    with pytest.raises(ConfigError, match="rebuild_index=True is for write_mode='merge-on-read' only"):
        IcebergSink("db.t", warehouse=wh, mode="upsert", key_columns=["id"], rebuild_index=True)
    sink = IcebergSink("db.t", warehouse=wh, mode="upsert", key_columns=["id"], write_mode="merge-on-read")
    assert sink.keyed_writer and not sink.compacts
    assert sink.input_key_columns(None) == ["id"]  # a hash exchange on the key: the index is keyed state
    assert sink.restore_config() == {"operator": "IcebergSink", "mode": "upsert", "key_columns": ["id"],
                                     "write_mode": "merge-on-read"}  # fmt: skip


def test_the_pyiceberg_internals_the_row_delta_uses_are_there() -> None:
    check_pyiceberg()  # fails (naming the version) when an upgrade moved them
    from pyiceberg.table.update.snapshot import _SnapshotProducer

    assert {"_commit_window", "_parent_snapshot_id", "_deleted_data_files", "_added_data_files"} <= set(
        _SnapshotProducer.__annotations__
    )
