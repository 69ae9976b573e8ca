"""A table sink never overwrites or duplicates what another run committed.

* Checkpoint storage wiped, the job run again: refused before any file is written (the table unchanged,
  readable, its rows those committed); with ``allow_reprocessing`` it runs, re-reads everything (each row
  twice, as the docs say) and overwrites nothing (data file names are unique per run).
* An older retained checkpoint restored: refused; with ``allow_reprocessing`` the rows after it come twice.
* Local folders and moto's S3 server.
"""

from __future__ import annotations

import collections
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pytest
from sluice import CheckpointConfig, FixedDelayRestart, NoRestart, Pipeline, RestoreError
from sluice.checkpoint.storage_loader import checkpoint_storage
from sluice.connectors.generator import GeneratorSource
from sluice.sinks.tables.storage import arrow_filesystem

from tests.sinks.conftest import Ctx
from tests.sinks.tables.helpers import Target, ids


def with_bucket(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch.append_column("b", pc.cast(pc.bit_wise_and(batch.column("id"), 3), pa.string()))


def pipeline(target: Target, tmp: Path, records: int = 400, rate: float | None = None) -> tuple[GeneratorSource, Pipeline]:
    src = GeneratorSource(num_splits=2, records_per_split=records, batch_size=50, rows_per_second=rate)
    p = Pipeline(
        "lineage",
        parallelism=2,
        checkpoint=CheckpointConfig(interval=0.1, storage=str(tmp / "chk"), num_retained=1000),
        restart=NoRestart(),
    )
    p.source(src).map_batches(with_bucket).sink(target.sink(partition_by=["b"]))
    return src, p


def files(target: Target) -> dict[str, tuple[int, Any]]:
    """Every file under the target's root (data, logs, metadata): path -> (size, modification time)."""
    fs, root = arrow_filesystem(target.root, target.storage_options)
    out = {}
    for info in fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True)):
        if info.type == pafs.FileType.File:
            out[info.path[len(root) :]] = (info.size, info.mtime_ns)
    return out


def counts(table: pa.Table) -> collections.Counter[int]:
    return collections.Counter(table.column("id").to_pylist())


def wiped_storage_is_refused_then_allowed(target: Target, tmp: Path) -> None:
    src, p = pipeline(target, tmp)
    p.run(runtime="local", restore="none")
    expected = ids(src.expected())
    assert ids(target.read()) == expected
    shutil.rmtree(tmp / "chk")  # the checkpoint storage is lost; the table keeps every commit
    before = files(target)

    with pytest.raises(RestoreError) as err:
        pipeline(target, tmp)[1].run(runtime="local")  # restore="latest" finds nothing: a fresh start
    text = str(err.value)
    assert "\n" not in text and "already holds checkpoint" in text and "allow_reprocessing" in text, text
    assert files(target) == before, "the refused run wrote or changed files in the table"
    assert ids(target.read()) == expected and ids(target.read_independently()) == expected

    result = pipeline(target, tmp)[1].run(runtime="local", allow_reprocessing=True)
    assert result.status == "finished"
    got = counts(target.read())
    assert set(got) == set(expected) and set(got.values()) == {2}, "allow_reprocessing re-reads every row once more"
    assert counts(target.read_independently()) == got
    after = files(target)
    changed = [f for f, v in before.items() if f in after and after[f] != v and "/_delta_log/" not in f]
    assert not changed, f"files of the first run were overwritten: {changed[:3]}"
    data = [f for f in after if f.endswith(".parquet")]
    assert len(data) == len(set(data)) and set(data) >= {f for f in before if f.endswith(".parquet")}


def test_wiped_checkpoint_storage_is_refused_before_any_write(local_target: Target, tmp_path: Path) -> None:
    wiped_storage_is_refused_then_allowed(local_target, tmp_path)


def test_wiped_checkpoint_storage_on_s3_is_refused_before_any_write(s3_target: Target, tmp_path: Path) -> None:
    wiped_storage_is_refused_then_allowed(s3_target, tmp_path)


def test_restoring_an_older_checkpoint_than_the_table_holds_is_refused(local_target: Target, tmp_path: Path) -> None:
    src, p = pipeline(local_target, tmp_path, records=1000, rate=400)
    assert not local_target.exists()  # (creates the SQLite catalog's tables before the job's threads race to)
    client = p.start(runtime="local", restore="none", control_endpoint=None)
    deadline = time.monotonic() + 120
    while local_target.versions() < 2 and client.running and time.monotonic() < deadline:
        time.sleep(0.02)  # until two checkpoints committed rows: the oldest one is behind the table
    client.wait()
    expected = ids(src.expected())
    assert ids(local_target.read()) == expected
    storage = checkpoint_storage(str(tmp_path / "chk"), "lineage")
    oldest = storage.completed()[0][1]
    assert local_target.versions() >= 2, "no two checkpoints committed rows: nothing is older than the table"
    before = files(local_target)

    with pytest.raises(RestoreError, match="allow_reprocessing"):
        pipeline(local_target, tmp_path, records=1000)[1].run(runtime="local", restore=oldest)
    assert files(local_target) == before
    assert ids(local_target.read()) == expected

    pipeline(local_target, tmp_path, records=1000)[1].run(runtime="local", restore=oldest, allow_reprocessing=True)
    got = counts(local_target.read())
    assert set(got) == set(expected) and sum(got.values()) > len(expected), "nothing was re-read"
    for split in (0, 1):  # once up to the restored checkpoint's position, twice after it: the re-read range
        times = [got[i] for i in range(split * 1000, split * 1000 + 1000)]
        assert times == sorted(times) and set(times) <= {1, 2}, f"split {split}: {collections.Counter(times)}"
    assert counts(local_target.read_independently()) == got


def test_data_file_names_are_unique_per_run(local_target: Target) -> None:
    """Two writers of the same job, checkpoint, subtask and attempt (two runs) never pick the same name."""
    sink = local_target.sink(partition_by=["b"])
    names = []
    for _ in range(2):
        w = sink.create_writer(Ctx(job_id="job", subtask=0, attempt=0), [])
        w.write(with_bucket(pa.record_batch([pa.array(range(8), pa.int64())], names=["id"])))
        names.append({f.path for f in w.prepare_commit(1)})
    assert names[0] and not names[0] & names[1], names



def test_a_rerun_after_stop_with_savepoint_resumes_from_the_savepoint(local_target: Target, tmp_path: Path) -> None:
    """The savepoint a stop ends with is committed to the table, and restore="latest" takes the newest
    checkpoint *or savepoint*: a plain rerun resumes from it, exactly once (before: it restored the last
    checkpoint before the savepoint and the rows between them came twice)."""
    seen: list[int] = []

    def count(batch: pa.RecordBatch) -> pa.RecordBatch:
        seen.append(batch.num_rows)
        return batch

    src = GeneratorSource(num_splits=2, records_per_split=1000, batch_size=50, rows_per_second=400)
    p = Pipeline("lineage", checkpoint=CheckpointConfig(interval=3600, storage=str(tmp_path / "chk")), restart=NoRestart())
    p.source(src).map_batches(count).map_batches(with_bucket).sink(local_target.sink(partition_by=["b"]))
    client = p.start(runtime="local", restore="none", control_endpoint=None)
    deadline = time.monotonic() + 120
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)  # rows went by before the savepoint's barrier: the savepoint commits them
    stopped = client.stop(savepoint=True)
    assert stopped.status == "stopped" and stopped.stopped_at and "savepoint-" in stopped.stopped_at, stopped
    assert local_target.read().num_rows > 0
    pipeline(local_target, tmp_path, records=1000)[1].run(runtime="local")
    assert ids(local_target.read()) == ids(src.expected())


@pytest.mark.spark
def test_wiped_checkpoint_storage_on_the_spark_runtime(spark: Any, tmp_path: Path) -> None:
    """The driver refuses before the Spark stage; allowed, the run's checkpoint ids start above the table's."""
    target = Target("delta", str(tmp_path / "lake"), {}, str(tmp_path))
    src, p = pipeline(target, tmp_path)
    first = p.run(runtime="spark", restore="none")
    shutil.rmtree(tmp_path / "chk")
    before = files(target)
    with pytest.raises(RestoreError, match="already holds checkpoint"):
        pipeline(target, tmp_path)[1].run(runtime="spark")
    assert files(target) == before
    held = target.sink().committed_checkpoint("lineage", "delta-sink")
    assert held and held <= (first.last_checkpoint or 0)
    again = pipeline(target, tmp_path)[1].run(runtime="spark", allow_reprocessing=True)
    assert again.checkpoints and min(s.checkpoint_id for s in again.checkpoints) > held
    assert counts(target.read()) == collections.Counter({i: 2 for i in ids(src.expected())})


def test_a_crash_right_after_a_savepoint_restores_the_savepoint(local_target: Target, tmp_path: Path) -> None:
    """A savepoint taken while the job runs commits its rows; after a crash before the next checkpoint the
    restart restores that savepoint (the newest state whose output is committed), exactly once (before: it
    restored an older checkpoint, or none, and the rows between them came twice)."""
    crash = threading.Event()
    seen: list[int] = []

    def crash_when_told(batch: pa.RecordBatch) -> pa.RecordBatch:
        seen.append(batch.num_rows)
        if crash.is_set():
            crash.clear()
            raise RuntimeError("a crash after the savepoint")
        return batch

    src = GeneratorSource(num_splits=2, records_per_split=1000, batch_size=50, rows_per_second=400)
    p = Pipeline(
        "lineage", checkpoint=CheckpointConfig(interval=3600, storage=str(tmp_path / "chk")),
        restart=FixedDelayRestart(attempts=3, delay=0),
    )
    p.source(src).map_batches(crash_when_told).map_batches(with_bucket).sink(local_target.sink(partition_by=["b"]))
    assert not local_target.exists()  # (creates the SQLite catalog's tables before the job's threads race to)
    client = p.start(runtime="local", restore="none", control_endpoint=None)
    deadline = time.monotonic() + 120
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)  # rows went by: the savepoint commits them
    client.trigger_savepoint()
    while local_target.versions() < 1 and time.monotonic() < deadline:
        time.sleep(0.01)  # the savepoint's table commit landed (it runs after the savepoint completed)
    crash.set()
    result = client.wait()
    assert result.status == "finished" and result.attempts == 2, result
    assert ids(local_target.read()) == ids(src.expected())
