"""Upserts into Delta and Iceberg, driven as the upsert sink drives them (changes staged by writers,
collapsed and merged once per checkpoint at the global commit): the table equals a dict the changes were
applied to in order, after every checkpoint and at every table version; a replayed checkpoint changes
nothing; a merge that races a compaction runs again without losing or doubling a change; new nullable
columns join the table; staged files never outlive their commit."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from sluice.sink import CommitOutcome
from sluice.sinks.tables import TableSchemaError
from sluice.sinks.tables.changes import CHANGES_DIR, Op, change_table, remove_orphaned_changes

from tests.sinks.conftest import MotoS3
from tests.sinks.tables.conftest import s3_target_of
from tests.sinks.tables.helpers import Target
from tests.sinks.tables.upserts import Change, Upserts, apply_in_order, as_table, random_stream, table_state

State = dict[int, tuple[str | None, float | None]]


def versions_states(target: Target) -> list[State]:
    """What a reader of every table version sees (time travel), oldest first."""
    if target.kind == "delta":
        from deltalake import DeltaTable

        latest = target.delta_table().version()
        out = []
        for v in range(latest + 1):
            t = DeltaTable(f"{target.root}/table", version=v, storage_options=target._delta_options())
            out.append(table_state(t.to_pyarrow_table()) if t.schema().fields else {})
        return out
    table = target.iceberg_table()
    return [table_state(table.scan(snapshot_id=s.snapshot_id).to_arrow()) for s in table.snapshots()]


def staged_left(up: Upserts) -> list[str]:
    import pyarrow.fs as pafs

    fs, root = up.fs()
    infos = fs.get_file_info(pafs.FileSelector(f"{root}/{CHANGES_DIR}", recursive=True, allow_not_found=True))
    return [i.path for i in infos if i.type == pafs.FileType.File]


def run_stream(up: Upserts, checkpoints: int, per_checkpoint: int, keys: int, seed: int = 1) -> list[State]:
    """Commit a random change stream checkpoint by checkpoint; returns the reference after each one."""
    rng = random.Random(seed)
    ref: State = {}
    prefixes: list[State] = [{}]
    for cid in range(1, checkpoints + 1):
        changes = random_stream(rng, per_checkpoint, keys, start_order=cid * 10_000)
        assert up.checkpoint(cid, changes) is CommitOutcome.COMMITTED
        apply_in_order(ref, changes)
        prefixes.append(dict(ref))
        assert up.state() == ref, f"the table differs from the changes applied in order after checkpoint {cid}"
        assert up.engine.committed() == cid
        assert staged_left(up) == [], "a committed checkpoint's staged change files are still there"
    return prefixes


def test_a_change_stream_merged_per_checkpoint_equals_applying_it_in_order(local_target: Target) -> None:
    up = Upserts(local_target)
    prefixes = run_stream(up, checkpoints=8, per_checkpoint=150, keys=40)
    assert table_state(local_target.read_independently()) == prefixes[-1]  # DuckDB (Delta), Polars (Iceberg)
    versions = versions_states(local_target)
    for v, state in enumerate(versions):
        assert state in prefixes, f"table version {v} is no prefix of the change stream ending at a checkpoint"
    assert versions[-1] == prefixes[-1]
    assert [prefixes.index(s) for s in versions] == sorted(prefixes.index(s) for s in versions)


def test_replaying_committed_checkpoints_changes_nothing(local_target: Target) -> None:
    up = Upserts(local_target)
    rng = random.Random(5)
    first, second = random_stream(rng, 100, 20, 0), random_stream(rng, 100, 20, 1000)
    up.checkpoint(1, first)
    up.checkpoint(2, second)
    state, versions = up.state(), local_target.versions()
    for cid, changes in ((2, second), (1, first)):  # the re-commit after a restore, then an older one
        from sluice.sinks.tables.changes import collapse

        outcome = up.engine.apply(cid, collapse(as_table(changes), ["id"]))
        assert outcome is CommitOutcome.ALREADY_COMMITTED
    fresh = Upserts(local_target).engine  # another attempt's committer
    assert fresh.committed() == 2
    assert up.state() == state and local_target.versions() == versions


def test_a_checkpoint_that_changes_no_row_is_still_recorded(local_target: Target) -> None:
    up = Upserts(local_target)
    up.checkpoint(1, [Change(1, Op.INSERT, "a", 1.0, 1)])
    assert up.checkpoint(2, [Change(99, Op.DELETE, None, None, 2)]) is CommitOutcome.COMMITTED
    assert up.engine.committed() == 2
    assert up.state() == {1: ("a", 1.0)}


def test_a_composite_key_and_several_changes_per_key_in_one_checkpoint(local_target: Target) -> None:
    up = Upserts(local_target, keys=("region", "id"))

    def batch(rows: list[tuple[str, int, Op, float | None]], start: int) -> pa.Table:
        body = pa.table({"region": [r[0] for r in rows], "id": pa.array([r[1] for r in rows], pa.int64()),
                         "amount": pa.array([r[3] for r in rows], pa.float64())})
        return change_table(body, [int(r[2]) for r in rows], range(start, start + len(rows)))

    f = up.stage(1, batch([("eu", 1, Op.INSERT, 1.0), ("us", 1, Op.INSERT, 2.0), ("eu", 1, Op.UPDATE, 3.0),
                           ("eu", 2, Op.INSERT, 4.0), ("eu", 2, Op.DELETE, None)], 0))
    assert up.commit(1, [f]) is CommitOutcome.COMMITTED
    f = up.stage(2, batch([("us", 1, Op.DELETE, None), ("us", 1, Op.READ, 5.0), ("eu", 2, Op.UPDATE, 6.0),
                           ("eu", 1, Op.DELETE, None)], 10))
    assert up.commit(2, [f]) is CommitOutcome.COMMITTED
    got = local_target.read().sort_by([("region", "ascending"), ("id", "ascending")])
    assert got.select(["region", "id", "amount"]).to_pylist() == [
        {"region": "eu", "id": 2, "amount": 6.0},
        {"region": "us", "id": 1, "amount": 5.0},
    ]


def with_note(changes: list[Change]) -> pa.Table:
    t = as_table(changes)
    return t.add_column(3, "note", pa.array([f"note-{c.key}" if c.op is not Op.DELETE else None for c in changes]))


def test_new_nullable_columns_join_the_table_in_merge_mode_and_are_refused_in_strict(local_target: Target) -> None:
    strict = Upserts(local_target)
    strict.checkpoint(1, [Change(1, Op.INSERT, "a", 1.0, 1), Change(2, Op.INSERT, "b", 2.0, 2)])
    later = [Change(2, Op.UPDATE, "b2", 2.5, 3), Change(3, Op.INSERT, "c", 3.0, 4)]
    f = strict.stage(2, with_note(later))
    with pytest.raises(TableSchemaError, match="schema_mode='merge'"):
        strict.commit(2, [f])
    merging = Upserts(local_target, schema_mode="merge")
    assert merging.commit(2, [f]) is CommitOutcome.COMMITTED
    got = {r["id"]: r for r in local_target.read().to_pylist()}
    assert got[1]["note"] is None and got[2]["note"] == "note-2" and got[3]["note"] == "note-3"
    assert got[2]["name"] == "b2"
    assert merging.checkpoint(3, [Change(1, Op.UPDATE, "a3", 1.5, 5)]) is CommitOutcome.COMMITTED  # without it


def _schemas(target: Target) -> list[list[str]]:
    """The columns of every version (Delta) or snapshot (Iceberg) of the table, oldest first."""
    if target.kind == "delta":
        from deltalake import DeltaTable

        last = target.delta_table().version()
        return [
            DeltaTable(f"{target.root}/table", version=v, storage_options=target._delta_options()).schema().to_arrow().names
            for v in range(last + 1)
        ]
    table = target.iceberg_table()
    schemas = table.schemas()
    return [[f.name for f in schemas[snap.schema_id].fields] for snap in table.snapshots()]


def test_a_new_column_joins_the_table_with_the_merge_that_brings_it_never_before(local_target: Target) -> None:
    """The column a checkpoint's changes add lands in the merge's own commit. It was a commit of its own
    before the merge (Delta ``alter``, Iceberg ``update_schema``): a crash between the two, and the restored
    job's table had a column that no committed change carried, before the job had read one again."""
    up = Upserts(local_target, schema_mode="merge")
    up.checkpoint(1, [Change(1, Op.INSERT, "a", 1.0, 1), Change(2, Op.INSERT, "b", 2.0, 2)])
    f = up.stage(2, with_note([Change(2, Op.UPDATE, "b2", 2.5, 3), Change(3, Op.INSERT, "c", 3.0, 4)]))

    def crash(point: str) -> None:
        if point == "table_commit":
            raise RuntimeError("crash before the merge's commit")

    with pytest.raises(RuntimeError, match="crash before"):
        up.commit(2, [f], crash)
    assert "note" not in local_target.read().column_names  # what the restored job finds
    assert all("note" not in columns for columns in _schemas(local_target)), _schemas(local_target)
    up.engine = up.make_engine()  # the restored attempt's committer merges checkpoint 2 again
    assert up.commit(2, [f]) is CommitOutcome.COMMITTED
    schemas = _schemas(local_target)
    assert "note" in schemas[-1] and all("note" not in columns for columns in schemas[:-1]), schemas
    got = {r["id"]: r for r in local_target.read().to_pylist()}
    assert (got[1]["note"], got[2]["note"], got[3]["note"]) == (None, "note-2", "note-3")


def concurrent_compaction(target: Target) -> Any:
    """A hook that, the first time a merge is about to commit, compacts the table in another commit:
    every file the merge read is replaced by a merged one (Delta ``optimize``; Iceberg the sink's rewrite)."""
    calls: list[int] = []

    def hook(point: str) -> None:
        if point != "table_commit":
            return
        calls.append(1)
        if len(calls) > 1:
            return
        if target.kind == "delta":
            from deltalake import DeltaTable

            metrics = DeltaTable(f"{target.root}/table", storage_options=target._delta_options()).optimize.compact()
            assert metrics["numFilesRemoved"] >= 2, metrics
        else:
            from sluice.sinks.tables import RewritePolicy

            from tests.sinks.tables.test_rewrite import rewrite_now

            policy = RewritePolicy(every=1, min_files=2, target_size=64 * 1024 * 1024)
            assert rewrite_now(target, target.sink(), policy) >= 2

    hook.calls = calls  # type: ignore[attr-defined]
    return hook


def test_a_merge_racing_a_compaction_runs_again_without_losing_or_doubling_a_change(local_target: Target) -> None:
    up = Upserts(local_target)
    rng = random.Random(11)
    ref: State = {}
    for cid in range(1, 4):  # key ranges of their own: each checkpoint adds a data file, to compact
        changes = random_stream(rng, 60, 30, cid * 1000, first_key=cid * 100)
        up.checkpoint(cid, changes)
        apply_in_order(ref, changes)
    changes = random_stream(rng, 90, 400, 9000)
    apply_in_order(ref, changes)
    files = [up.stage(4, as_table(changes))]
    hook = concurrent_compaction(local_target)
    assert up.commit(4, files, hook) is CommitOutcome.COMMITTED
    assert len(hook.calls) == 2, "the merge that lost the race was not run again"
    assert up.state() == ref
    assert up.engine.committed() == 4


def test_a_merge_that_keeps_losing_races_asks_to_retry_later_and_changes_nothing(local_target: Target) -> None:
    up = Upserts(local_target)
    up.checkpoint(1, random_stream(random.Random(2), 50, 20, 0))
    up.checkpoint(2, random_stream(random.Random(3), 50, 20, 1000, first_key=100))
    up.engine = up.make_engine(conflict_attempts=1)
    state = up.state()
    files = [up.stage(3, as_table(random_stream(random.Random(4), 50, 20, 2000)))]
    assert up.commit(3, files, concurrent_compaction(local_target)) is CommitOutcome.RETRY_LATER
    assert up.state() == state and up.engine.committed() == 2
    assert staged_left(up), "the staged changes of a checkpoint not yet merged were deleted"
    assert up.commit(3, files) is CommitOutcome.COMMITTED  # the engine's retry
    assert staged_left(up) == []


def test_a_crash_before_the_commit_leaves_nothing_once_the_next_attempt_starts(local_target: Target) -> None:
    up = Upserts(local_target)
    rng = random.Random(8)
    ref: State = {}
    first = random_stream(rng, 80, 25, 0)
    up.checkpoint(1, first)
    apply_in_order(ref, first)
    restored = random_stream(rng, 80, 25, 1000)  # checkpoint 2 completed; its commit crashed
    restored_files = [up.stage(2, as_table(restored), sub) for sub in (0, 1)]
    never = up.stage(3, as_table(random_stream(rng, 80, 25, 2000)))  # checkpoint 3 never completed

    def crash(point: str) -> None:
        raise RuntimeError(f"crash at {point}")

    with pytest.raises(RuntimeError, match="crash at table_commit"):
        up.commit(2, restored_files, crash)
    # the next attempt, restoring checkpoint 2, starts: cleanup first, then the restored checkpoint's commit
    again = Upserts(local_target)
    fs, root = again.fs()
    keep = {f.path for f in restored_files}
    assert remove_orphaned_changes(fs, root, "job", again.engine.committed(), 2, keep) == 1
    if local_target.kind == "iceberg":
        assert again.engine.remove_orphans() >= 1, "the crashed merge's files were not found"  # type: ignore[union-attr]
    assert sorted(Path(p).name for p in staged_left(again)) == sorted(Path(f.path).name for f in restored_files)
    assert never.path not in keep
    assert again.commit(2, restored_files) is CommitOutcome.COMMITTED
    apply_in_order(ref, restored)
    assert again.state() == ref
    assert staged_left(again) == []
    live = {Path(p).name for p in local_target.files()}
    on_storage = {Path(p).name for p in data_files_on_storage(local_target)}
    if local_target.kind == "iceberg":  # Delta keeps replaced files for time travel (until VACUUM), as Iceberg
        assert {n for n in on_storage - live if n.startswith("merge-")} <= replaced_merge_files(local_target)


def data_files_on_storage(target: Target) -> list[str]:
    import pyarrow.fs as pafs
    from sluice.sinks.tables.storage import arrow_filesystem

    fs, root = arrow_filesystem(target.root, target.storage_options)
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    return [i.path for i in infos if i.type == pafs.FileType.File and i.path.endswith(".parquet")]


def replaced_merge_files(target: Target) -> set[str]:
    """The data files some snapshot references (replaced ones are kept for time travel)."""
    table = target.iceberg_table()
    names = set()
    for s in table.snapshots():
        names |= {Path(t.file.file_path).name for t in table.scan(snapshot_id=s.snapshot_id).plan_files()}
    return names


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_upserts_on_s3(kind: str, moto_s3: MotoS3, tmp_path: Path) -> None:
    target = s3_target_of(kind, moto_s3, str(tmp_path))
    up = Upserts(target)
    prefixes = run_stream(up, checkpoints=3, per_checkpoint=120, keys=30, seed=4)
    assert up.engine.apply(3, as_table([Change(1, Op.DELETE, None, None, 1)])) is CommitOutcome.ALREADY_COMMITTED
    assert up.state() == prefixes[-1]


def test_an_update_moving_a_row_to_another_partition_leaves_no_copy_behind(local_target: Target) -> None:
    up = Upserts(local_target, partition_by=("region",))
    rng = random.Random(13)
    ref: dict[int, tuple[str, float]] = {}
    order = 0
    for cid in range(1, 6):
        rows = []
        for _ in range(60):
            k, op = rng.randrange(30), rng.choice([Op.INSERT, Op.UPDATE, Op.UPDATE, Op.DELETE])
            region = rng.choice(["eu", "us", "ap"])  # an update may move its key to another region
            rows.append((k, op, region, float(order)))
            order += 1
        body = pa.table({"id": pa.array([r[0] for r in rows], pa.int64()), "region": [r[2] for r in rows],
                         "amount": [r[3] for r in rows]})
        f = up.stage(cid, change_table(body, [int(r[1]) for r in rows], range(order - len(rows), order)))
        assert up.commit(cid, [f]) is CommitOutcome.COMMITTED
        for k, op, region, amount in rows:
            if op is Op.DELETE:
                ref.pop(k, None)
            else:
                ref[k] = (region, amount)
        got = local_target.read()
        ids = got.column("id").to_pylist()
        assert len(ids) == len(set(ids)), f"a key is in two partitions after checkpoint {cid}"
        assert dict(zip(ids, zip(got.column("region").to_pylist(), got.column("amount").to_pylist(), strict=True),
                        strict=True)) == ref
    assert {p.split("/")[-2] for p in local_target.files()} <= {"region=eu", "region=us", "region=ap"}
