"""Small-file compaction: merging, holding back across checkpoints, recovery after a crash at each step."""

from __future__ import annotations

import os

import pyarrow.parquet as pq
import pytest
from sluice.sinks.files import CompactionPolicy, FileSink, RollingPolicy

from tests.sinks.conftest import Ctx, compact, local_files, read_visible, same_rows
from tests.sinks.files.test_lifecycle import expected, rows


def make(tmp_path, fmt: str = "parquet", **compaction) -> FileSink:
    return FileSink(
        str(tmp_path / "out"),
        format=fmt,
        bucket_by=["b"],
        rolling=RollingPolicy(max_size=800),
        row_group_size=1000,
        compaction=CompactionPolicy(**{"target_size": 10**7, **compaction}),
    )


def write(w, start: int, end: int, step: int = 20) -> None:
    for i in range(start, end, step):
        w.write(rows(i, min(end, i + step)))


@pytest.mark.parametrize("fmt", ["parquet", "json", "csv"])
def test_a_checkpoints_small_files_become_one_file_per_bucket(tmp_path, fmt) -> None:
    sink = make(tmp_path, fmt)
    ctx = Ctx()
    w, c = sink.create_writer(ctx, []), sink.create_committer(ctx)
    write(w, 0, 400)
    staged = w.prepare_commit(1)
    assert len(staged) > 4
    merged = compact(sink, 1, staged)
    assert sorted(x.bucket for x in merged) == ["b=0", "b=1"]
    assert all("-c0" in x.final for x in merged)
    assert sum(x.rows for x in merged) == 400
    # the originals are gone, only the merged pending files remain (hidden)
    assert sorted(os.path.join(sink.path, x.staged) for x in merged) == sorted(
        os.path.join(sink.path, f) for f in local_files(sink.path)
    )
    c.commit(merged)
    same_rows(read_visible(sink.path, fmt), expected(0, 400))
    if fmt == "parquet":  # merged into full row groups, not one tiny row group per original file
        assert pq.ParquetFile(os.path.join(sink.path, merged[0].final)).metadata.num_row_groups == 1


def test_target_size_bounds_merged_files(tmp_path) -> None:
    sink = make(tmp_path, target_size=3000)
    w = sink.create_writer(Ctx(), [])
    write(w, 0, 400)
    merged = compact(sink, 1, w.prepare_commit(1))
    assert len(merged) > 2
    assert all(x.size < 2 * 3000 for x in merged)


@pytest.mark.parametrize("crash_at", range(3))
def test_crash_at_each_compaction_step_then_recover_keeps_exactly_once(tmp_path, crash_at) -> None:
    sink = make(tmp_path)
    ctx = Ctx()
    w, c = sink.create_writer(ctx, []), sink.create_committer(ctx)
    write(w, 0, 200)
    done = compact(sink, 1, w.prepare_commit(1))  # checkpoint 1 completes
    c.commit(done)
    write(w, 200, 400)
    staged = w.prepare_commit(2)
    ctx2 = Ctx(fault_at="compaction", fault_after=crash_at)
    with pytest.raises(RuntimeError, match="crash at compaction"):
        compact(sink, 2, staged, ctx2)
    w.close()
    # restart: restore checkpoint 1 (already committed); checkpoint 2 never completed
    sink.recover("job", done)
    assert not [f for f in local_files(sink.path) if os.path.basename(f).startswith(".")]
    c.commit(done)
    w2 = sink.create_writer(Ctx(attempt=1), [])
    write(w2, 200, 400)  # the source replays what followed checkpoint 1
    c.commit(compact(sink, 2, w2.prepare_commit(2)))
    same_rows(read_visible(sink.path), expected(0, 400))


def test_small_files_held_across_checkpoints_survive_a_restore(tmp_path) -> None:
    sink = make(tmp_path, max_checkpoints=3)
    ctx = Ctx()
    w, c = sink.create_writer(ctx, []), sink.create_committer(ctx)
    write(w, 0, 100)
    cp1 = compact(sink, 1, w.prepare_commit(1))
    assert cp1 and all(x.held for x in cp1)
    state1 = w.snapshot_state(1)
    c.commit(cp1)  # checkpoint 1 completes: nothing becomes visible yet
    assert read_visible(sink.path).num_rows == 0
    write(w, 100, 200)
    compact(sink, 2, w.prepare_commit(2))  # checkpoint 2 never completes; the job restarts from 1
    w.close()
    sink.recover("job", cp1)
    c.commit(cp1)
    w2 = sink.create_writer(Ctx(attempt=1), [state1])
    write(w2, 100, 200)
    cp2 = compact(sink, 2, w2.prepare_commit(2))
    assert all(x.held for x in cp2)
    write(w2, 200, 300)
    cp3 = compact(sink, 3, w2.prepare_commit(3))  # third checkpoint: released and merged
    assert not any(x.held for x in cp3)
    assert sorted(x.bucket for x in cp3) == ["b=0", "b=1"]
    assert all(x.replaces for x in cp3)  # originals of checkpoints 1 and 2 go only once this is visible
    c.commit(cp2)
    c.commit(cp3)
    c.commit(cp3)
    same_rows(read_visible(sink.path), expected(0, 300))
    assert not [f for f in local_files(sink.path) if os.path.basename(f).startswith(".")]
