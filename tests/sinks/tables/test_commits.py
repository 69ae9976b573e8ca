"""The table commit protocol, driven directly: idempotent by (job, sink, checkpoint), restarted checkpoint
ids refused, files of checkpoints that never completed deleted, a real concurrent writer between pre-commit
and commit retried without a duplicate, a commit that keeps failing fails the job naming table, checkpoint
and cause."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from sluice import CheckpointConfig, CommitError, JobFailedError, NoRestart, Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.operators.committables import commit_with_retry
from sluice.sink import CommitOutcome
from sluice.sinks.tables import TableLineageError

from tests.sinks.conftest import Ctx
from tests.sinks.tables.helpers import Target, ids


class GCtx:
    """A GlobalCommitterContext; ``at_table_commit`` runs where another writer may commit."""

    def __init__(self, restored: int | None = None, job_id: str = "job", at_table_commit: Callable[[], None] | None = None) -> None:
        self.job_id, self.sink_uid, self.attempt, self.restored_checkpoint_id = job_id, "sink", 0, restored
        self.metrics: dict[str, int] = {}
        self.at_table_commit = at_table_commit

    def metric(self, name: str, increment: int = 1) -> None:
        self.metrics[name] = self.metrics.get(name, 0) + increment

    def fault_hook(self, point: str) -> None:
        if point == "table_commit" and self.at_table_commit is not None:
            self.at_table_commit()


def batch(start: int, n: int = 10) -> pa.RecordBatch:
    idx = pa.array(range(start, start + n), pa.int64())
    return pa.record_batch([idx, pa.array([str(i % 2) for i in range(start, start + n)])], names=["id", "b"])


def precommit(sink: Any, checkpoint_id: int, start: int, job_id: str = "job", subtask: int = 0) -> list[Any]:
    w = sink.create_writer(Ctx(job_id=job_id, subtask=subtask), [])
    w.write(batch(start))
    return list(w.prepare_commit(checkpoint_id))


def test_a_recommit_is_already_committed_and_adds_no_version(local_target: Target) -> None:
    sink = local_target.sink(partition_by=["b"])
    files = precommit(sink, 1, 0)
    assert not local_target.exists() or local_target.read().num_rows == 0, "pre-committed data is visible"
    first = sink.create_global_committer(GCtx())
    assert first.commit(1, files) is CommitOutcome.COMMITTED
    versions = local_target.versions()
    assert first.commit(1, files) is CommitOutcome.ALREADY_COMMITTED  # a retry of the same commit
    after_restore = sink.create_global_committer(GCtx(restored=1))
    assert after_restore.commit(1, files) is CommitOutcome.ALREADY_COMMITTED  # the re-commit after a restore
    assert local_target.versions() == versions
    assert ids(local_target.read()) == list(range(10))


def test_restarted_checkpoint_ids_fail_at_once_instead_of_skipping_data(local_target: Target) -> None:
    sink = local_target.sink(partition_by=["b"])
    sink.create_global_committer(GCtx()).commit(5, precommit(sink, 5, 0))
    fresh = sink.create_global_committer(GCtx())  # a new run whose checkpoint ids started again at 1
    ctx = GCtx()
    with pytest.raises(TableLineageError, match="checkpoint ids restarted"):
        commit_with_retry("sink", fresh.commit, 3, precommit(sink, 3, 100), metric=ctx.metric)
    assert "commit_retries" not in ctx.metrics, "a ConfigError must not be retried"
    assert ids(local_target.read()) == list(range(10))


def test_recover_deletes_only_files_no_completed_checkpoint_names(local_target: Target) -> None:
    sink = local_target.sink(partition_by=["b"])
    committed = precommit(sink, 1, 0)
    sink.create_global_committer(GCtx()).commit(1, committed)
    restored = precommit(sink, 2, 10)  # checkpoint 2 completed, its commit did not happen yet
    orphans = precommit(sink, 3, 20, subtask=1)  # checkpoint 3 never completed
    other_job = precommit(sink, 3, 30, job_id="other")
    fs, root = sink.table_format().filesystem()

    def present(files: list[Any]) -> bool:
        return all(fs.get_file_info(f"{root}/{f.path}").type.name == "File" for f in files)

    sink.recover("job", restored)  # what the engine does before an attempt that restores checkpoint 2
    committer = sink.create_global_committer(GCtx(restored=2))
    assert present(committed) and present(restored) and present(other_job)
    assert not any(fs.get_file_info(f"{root}/{f.path}").type.name == "File" for f in orphans)
    assert committer.commit(2, restored) is CommitOutcome.COMMITTED
    assert ids(local_target.read()) == list(range(20))


@pytest.mark.parametrize("library_retries", [True, False], ids=["library-rebases", "engine-retries"])
def test_a_concurrent_writer_between_precommit_and_commit_never_causes_a_duplicate(
    local_target: Target, library_retries: bool
) -> None:
    kw: dict[str, Any] = {"partition_by": ["b"]}
    if local_target.kind == "delta" and not library_retries:
        kw["commit_retries"] = 0
    if local_target.kind == "iceberg" and not library_retries:
        kw["table_properties"] = {"commit.retry.num-retries": "0"}
    sink = local_target.sink(**kw)
    sink.create_global_committer(GCtx()).commit(1, precommit(sink, 1, 0))
    other = pa.table({"id": pa.array([1000, 1001], pa.int64()), "b": ["0", "1"]})
    raced: list[int] = []

    def another_writer() -> None:  # a different client commits to the same table, once
        if raced:
            return
        raced.append(1)
        if local_target.kind == "delta":
            from deltalake import write_deltalake

            write_deltalake(local_target.delta_table(), other, mode="append")
        else:
            local_target.iceberg_table().append(other.cast(pa.schema([("id", pa.int64()), ("b", pa.large_string())])))

    ctx = GCtx(at_table_commit=another_writer)
    committer = sink.create_global_committer(ctx)
    outcome = commit_with_retry("sink", committer.commit, 2, precommit(sink, 2, 10), metric=ctx.metric)
    assert outcome is CommitOutcome.COMMITTED and raced
    if not library_retries:
        assert ctx.metrics.get("commit_retries", 0) >= 1, "the lost race was not retried by the engine"
    assert ids(local_target.read()) == [*range(20), 1000, 1001]
    assert committer.commit(2, []) is CommitOutcome.COMMITTED  # nothing to do
    assert ids(local_target.read()) == [*range(20), 1000, 1001]


class BrokenStore:
    """A fault hook: every table commit fails as an unreachable store would."""

    def hit(self, point: str, where: str = "") -> None:
        if point == "table_commit":
            raise OSError("the object store is unreachable")

    def for_attempt(self, attempt: int) -> None:
        return None

    def in_slot(self, slot: int, report: Any) -> None:
        return None

    def record(self, description: str) -> None:
        return None


def test_a_commit_that_keeps_failing_fails_the_job_naming_table_checkpoint_and_cause(local_target: Target, tmp_path: Path) -> None:
    p = Pipeline("broken", checkpoint=CheckpointConfig(interval=0.1, storage=str(tmp_path / "chk")), restart=NoRestart())
    p.source(GeneratorSource(num_splits=1, records_per_split=300, batch_size=50)).sink(local_target.sink())
    with pytest.raises(JobFailedError) as err:
        p.run(runtime="local", restore="none", faults=BrokenStore())
    cause = err.value.__cause__
    assert isinstance(cause, CommitError), repr(cause)
    text = str(cause)
    where = "table" if local_target.kind == "delta" else "db.events"
    assert where in text and "checkpoint" in text and "object store is unreachable" in text, text
    assert local_target.read().num_rows == 0  # the table stays valid: nothing half-committed


def _with(b: pa.RecordBatch, name: str, values: list[Any]) -> pa.RecordBatch:
    return b.append_column(name, pa.array(values))


def test_an_iceberg_append_adds_a_new_column_in_the_snapshot_that_brings_it_never_before(tmp_path: Path) -> None:
    """``schema_mode="merge"``: a column the writers see first joins the table's current schema in the commit
    of the checkpoint whose rows carry it. Before, the writer evolved the table when it first saw the column
    (its files need the column's field id): a crash before that checkpoint completed left the table with a
    column no committed row carries, and a reader saw it. Now the writer adds the column to a schema that is
    not current (ids assigned, invisible to readers) and the commit makes it current with the snapshot."""
    target = Target("iceberg", str(tmp_path / "lake"), {}, str(tmp_path))
    sink = target.sink(schema_mode="merge", partition_by=["b"])
    sink.create_global_committer(GCtx()).commit(1, precommit(sink, 1, 0))

    def current() -> list[str]:
        return [f.name for f in target.iceberg_table().schema().fields]

    files = []
    for subtask, (column, values) in enumerate((("note", [f"n{i}" for i in range(10)]), ("score", [float(i) for i in range(10)]))):
        w = sink.create_writer(Ctx(subtask=subtask), [])
        w.write(_with(batch(10 + 10 * subtask), column, values))
        files += w.prepare_commit(2)
    assert current() == ["id", "b"], "a column joined the table before a checkpoint carrying it completed"
    assert target.read().column_names == ["id", "b"] and ids(target.read()) == list(range(10))

    def crash() -> None:
        raise RuntimeError("crash before the commit")

    with pytest.raises(CommitError, match="crash before"):
        sink.create_global_committer(GCtx(at_table_commit=crash)).commit(2, files)
    assert current() == ["id", "b"] and ids(target.read()) == list(range(10))
    # the restored attempt commits checkpoint 2 again; a new writer that sees "note" again reuses its field id
    assert sink.create_global_committer(GCtx(restored=2)).commit(2, files) is CommitOutcome.COMMITTED
    assert current() == ["id", "b", "note", "score"]
    w = sink.create_writer(Ctx(subtask=0), [])
    w.write(_with(batch(30), "note", ["again"] * 10))
    assert sink.create_global_committer(GCtx(restored=2)).commit(3, w.prepare_commit(3)) is CommitOutcome.COMMITTED
    assert current() == ["id", "b", "note", "score"]
    rows = {r["id"]: r for r in target.read().to_pylist()}
    assert sorted(rows) == list(range(40))
    assert (rows[0]["note"], rows[0]["score"]) == (None, None)
    assert (rows[12]["note"], rows[12]["score"]) == ("n2", None)
    assert (rows[23]["note"], rows[23]["score"]) == (None, 3.0)
    assert (rows[35]["note"], rows[35]["score"]) == ("again", None)
    table = target.iceberg_table()
    by_snapshot = [[f.name for f in table.schemas()[s.schema_id].fields] for s in table.snapshots()]
    assert by_snapshot == [["id", "b"], ["id", "b", "note", "score"], ["id", "b", "note", "score"]], by_snapshot


def test_a_delta_append_adds_a_new_column_in_the_version_that_brings_its_rows_never_before(tmp_path: Path) -> None:
    """``schema_mode="merge"``: a column the stream brings joins the Delta table in the version that commits
    the checkpoint's rows and its app transaction. Before, the committer added it in a version of its own
    (``alter.add_columns``) ahead of the rows: a crash between the two left the table with a column no
    committed row carries, and a reader saw it."""
    from deltalake import DeltaTable

    target = Target("delta", str(tmp_path / "lake"), {}, str(tmp_path))
    sink = target.sink(schema_mode="merge", partition_by=["b"])
    sink.create_global_committer(GCtx()).commit(1, precommit(sink, 1, 0))

    def crash() -> None:
        raise RuntimeError("crash before the commit")

    crashing = sink.create_global_committer(GCtx(at_table_commit=crash))  # made before the tasks start
    w = sink.create_writer(Ctx(subtask=0), [])
    w.write(_with(batch(10), "note", [f"n{i}" for i in range(10)]))
    files = w.prepare_commit(2)
    with pytest.raises(CommitError, match="crash before"):
        crashing.commit(2, files)
    assert target.read().column_names == ["id", "b"], "a column joined the table before its rows"
    assert ids(target.read()) == list(range(10))
    assert sink.create_global_committer(GCtx(restored=2)).commit(2, files) is CommitOutcome.COMMITTED
    assert sink.create_global_committer(GCtx(restored=2)).commit(2, files) is CommitOutcome.ALREADY_COMMITTED
    rows = {r["id"]: r for r in target.read().to_pylist()}
    assert sorted(rows) == list(range(20))
    assert (rows[3]["note"], rows[13]["note"], rows[13]["b"]) == (None, "n3", "1")
    path = str(tmp_path / "lake" / "table")
    for version in range(DeltaTable(path).version() + 1):  # every version: a column only with rows carrying it
        table = DeltaTable(path, version=version).to_pyarrow_table()
        if "note" in table.column_names:
            assert table.column("note").null_count < table.num_rows, f"version {version}: 'note' without rows"
    assert DeltaTable(path).transaction_version("sluice-job-sink") == 2
    w = sink.create_writer(Ctx(subtask=0), [])  # the column is the table's now: a plain append
    w.write(_with(batch(20), "note", ["again"] * 10))
    assert sink.create_global_committer(GCtx(restored=2)).commit(3, w.prepare_commit(3)) is CommitOutcome.COMMITTED
    assert sorted(r["id"] for r in target.read().to_pylist() if r["note"] == "again") == list(range(20, 30))
