"""The writer / committer / recover lifecycle on local disk, driven directly (no engine)."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from sluice.connectors.generator import default_rows
from sluice.sinks.files import FileSink, RollingPolicy, SchemaMismatchError

from tests.sinks.conftest import Ctx, compact, local_files, read_visible, same_rows


def rows(start: int, end: int) -> pa.RecordBatch:
    b = default_rows(0, start, end, 10**6, 100, 10)
    return b.append_column("b", pc.bit_wise_and(b.column("key"), 1))


def make(tmp_path, **kw) -> FileSink:
    kw.setdefault("bucket_by", ["b"])
    return FileSink(str(tmp_path / "out"), **kw)


def expected(start: int, end: int) -> pa.Table:
    return pa.Table.from_batches([rows(start, end)]).drop_columns(["b"])


@pytest.mark.parametrize(("fmt", "compression"), [("parquet", "zstd"), ("json", "none"), ("csv", "gzip")])
def test_files_are_hidden_until_commit_then_visible_once(tmp_path, fmt, compression) -> None:
    sink = make(tmp_path, format=fmt, compression=compression)
    ctx = Ctx()
    w, c = sink.create_writer(ctx, []), sink.create_committer(ctx)
    w.write(rows(0, 100))
    w.write(rows(100, 200))
    assert all(os.path.basename(f).startswith(".") for f in local_files(sink.path))
    comms = w.prepare_commit(1)
    assert {x.bucket for x in comms} == {"b=0", "b=1"}
    assert all(os.path.basename(f).endswith(".pending") for f in local_files(sink.path))
    assert not read_visible(sink.path, fmt).num_rows
    c.commit(comms)
    c.commit(comms)  # idempotent: a retry or a re-commit after restore publishes nothing twice
    same_rows(read_visible(sink.path, fmt), expected(0, 200))
    assert all(not os.path.basename(f).startswith(".") for f in local_files(sink.path))


def test_parquet_row_groups_and_compression(tmp_path) -> None:
    sink = make(tmp_path, bucket_by=[], compression="gzip", row_group_size=40)
    w = sink.create_writer(Ctx(), [])
    for i in range(5):
        w.write(rows(i * 20, i * 20 + 20))
    (c,) = w.prepare_commit(1)
    meta = pq.ParquetFile(os.path.join(sink.path, c.staged)).metadata
    assert meta.num_rows == 100
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [40, 40, 20]
    assert meta.row_group(0).column(0).compression == "GZIP"


def test_rolling_on_size_makes_several_files_per_checkpoint(tmp_path) -> None:
    sink = make(tmp_path, format="json", rolling=RollingPolicy(max_size=1000))
    w = sink.create_writer(Ctx(), [])
    for i in range(10):
        w.write(rows(i * 20, i * 20 + 20))
    comms = w.prepare_commit(3)
    assert len(comms) > 4
    assert len({x.final for x in comms}) == len(comms)
    assert all("-000003-000-" in x.final for x in comms)


def test_recover_deletes_what_the_restored_checkpoint_does_not_name(tmp_path) -> None:
    sink = make(tmp_path)
    w = sink.create_writer(Ctx(), [])
    w.write(rows(0, 50))
    kept = w.prepare_commit(1)
    w.write(rows(50, 100))
    w.prepare_commit(2)  # never completes
    w.write(rows(100, 120))  # in-progress when the crash happens
    other = make(tmp_path).create_writer(Ctx(job_id="job-2"), [])
    other.write(rows(0, 10))
    other.prepare_commit(1)
    sink.recover("job", kept)
    left = [os.path.basename(f) for f in local_files(sink.path)]
    assert sorted(left) == sorted(
        [os.path.basename(x.staged) for x in kept] + [f for f in left if f.startswith(".part-job-2-")]
    )
    sink.create_committer(Ctx()).commit(kept)
    same_rows(read_visible(sink.path).filter(pc.field("id") < 50), expected(0, 50))


def test_schema_mismatch_names_bucket_and_both_schemas(tmp_path) -> None:
    sink = make(tmp_path)
    w = sink.create_writer(Ctx(), [])
    w.write(rows(0, 10))
    bad = rows(10, 20)
    bad = bad.set_column(
        bad.schema.get_field_index("value"), "value", pc.cast(bad.column("value"), pa.string())
    )
    with pytest.raises(SchemaMismatchError) as err:
        w.write(bad)
    msg = str(err.value)
    assert "bucket 'b=0'" in msg or "bucket 'b=1'" in msg
    assert "value: string" in msg and "value: int64" in msg and "schema_evolution" in msg


def test_schema_evolution_rolls_to_a_new_file(tmp_path) -> None:
    sink = make(tmp_path, bucket_by=[], schema_evolution=True)
    ctx = Ctx()
    w = sink.create_writer(ctx, [])
    w.write(rows(0, 10))
    w.write(rows(10, 20).append_column("extra", pa.array(["x"] * 10)))
    comms = w.prepare_commit(1)
    assert len(comms) == 2 and comms[0].schema_fp != comms[1].schema_fp
    sink.create_committer(ctx).commit(comms)
    schemas = [pq.read_schema(os.path.join(sink.path, x.final)) for x in comms]
    assert "extra" not in schemas[0].names and "extra" in schemas[1].names


def test_end_input_flushes_everything(tmp_path) -> None:
    sink = make(tmp_path, compaction={"target_size": 10**9, "max_checkpoints": 5})
    ctx = Ctx()
    w, c = sink.create_writer(ctx, []), sink.create_committer(ctx)
    w.write(rows(0, 30))
    c.commit(compact(sink, 1, w.prepare_commit(1)))
    assert read_visible(sink.path).num_rows == 0  # held back to grow
    w.write(rows(30, 60))
    w.end_input()
    c.commit(compact(sink, 2, w.prepare_commit(2)))
    same_rows(read_visible(sink.path), expected(0, 60))
    assert all(not os.path.basename(f).startswith(".") for f in local_files(sink.path))
