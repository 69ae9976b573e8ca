"""The Iceberg copy-on-write merge rewrites only the data files that hold changed keys: files pruned by key
bounds and by partitions over the key (bucketing), files read but holding none of the keys left alone,
inserts in new files; the result equals pyiceberg's own delete + upsert of the same changes; the merge holds
the sink's rewrite lock."""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from sluice.sink import CommitOutcome
from sluice.sinks.iceberg.upsert import IcebergUpsert, pyiceberg_overwrite, pyiceberg_upsert
from sluice.sinks.tables.changes import Op, change_table, collapse

from tests.sinks.tables.helpers import Target
from tests.sinks.tables.upserts import Change, Upserts, apply_in_order, as_table, random_stream, table_state


def iceberg(tmp_path: Path, name: str = "lake") -> Upserts:
    return Upserts(Target("iceberg", str(tmp_path / name), {}, str(tmp_path)))


def upserts(keys: range, first_order: int, name: str = "v") -> list[Change]:
    return [Change(k, Op.INSERT, f"{name}{k}", float(k), first_order + i) for i, k in enumerate(keys)]


def live_files(up: Upserts) -> set[str]:
    return set(up.target.files())


def test_only_files_whose_key_range_holds_a_changed_key_are_read_and_replaced(tmp_path: Path) -> None:
    up = iceberg(tmp_path)
    for cid in range(4):  # four files: keys 0-99, 100-199, 200-299, 300-399
        assert up.checkpoint(cid + 1, upserts(range(cid * 100, cid * 100 + 100), cid * 1000)) is CommitOutcome.COMMITTED
        assert up.engine.last is not None and up.engine.last.files_read == 0  # disjoint inserts: nothing read
    before = live_files(up)
    assert len(before) == 4
    changes = [Change(150, Op.UPDATE, "x", -1.0, 9000), Change(151, Op.DELETE, None, None, 9001),
               Change(152, Op.UPDATE, "y", -2.0, 9002), Change(1000, Op.INSERT, "new", 1.0, 9003)]
    assert up.checkpoint(5, changes) is CommitOutcome.COMMITTED
    last = up.engine.last
    assert last is not None
    assert last.files_read == 1 and len(last.replaced) == 1, "files without a changed key were opened"
    assert last.rows_copied == 97
    after = live_files(up)
    assert len(before - after) == 1 and len(after - before) == 2  # one replaced; its replacement + the insert
    ref: dict[int, Any] = {}
    for cid in range(4):
        apply_in_order(ref, upserts(range(cid * 100, cid * 100 + 100), cid * 1000))
    apply_in_order(ref, changes)
    assert up.state() == ref


def test_a_file_whose_range_holds_the_key_but_not_its_row_is_read_and_left_alone(tmp_path: Path) -> None:
    up = iceberg(tmp_path)
    up.checkpoint(1, upserts(range(0, 100, 2), 0))  # even keys: 1 lies within the file's bounds, absent
    before = live_files(up)
    assert up.checkpoint(2, [Change(1, Op.INSERT, "odd", 1.0, 500)]) is CommitOutcome.COMMITTED
    last = up.engine.last
    assert last is not None and last.files_read == 1 and not last.replaced
    assert before < live_files(up)
    assert up.state()[1] == ("odd", 1.0) and len(up.state()) == 51


def bucketed(up: Upserts, buckets: int) -> Any:
    """Create the table bucketed by ``id`` (not offered by the sink's partition_by yet)."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import assign_fresh_schema_ids
    from pyiceberg.transforms import BucketTransform

    catalog = up.catalog()
    catalog.create_namespace_if_not_exists("db")
    rows = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.float64())])
    schema = assign_fresh_schema_ids(catalog._convert_schema_if_needed(rows))
    spec = PartitionSpec(PartitionField(schema.find_field("id").field_id, 1000, BucketTransform(buckets), "id_bucket"))
    return catalog.create_table("db.events", schema=schema, partition_spec=spec)


def test_a_table_bucketed_by_the_key_has_only_the_changed_buckets_read(tmp_path: Path) -> None:
    up = iceberg(tmp_path)
    bucketed(up, 8)
    up.checkpoint(1, upserts(range(2000), 0))
    assert len(live_files(up)) == 8  # one file per bucket, each spanning the whole key range
    table = up.target.iceberg_table()
    transform = table.spec().fields[0].transform.pyarrow_transform(table.schema().find_type(1))
    bucket_of = dict(zip(range(2000), transform(pa.array(range(2000), pa.int64())).to_pylist(), strict=True))
    in_bucket = [k for k in range(2000) if bucket_of[k] == 3][:20]
    changes = [Change(k, Op.UPDATE if i % 3 else Op.DELETE, "b3", 3.0, 10_000 + i) for i, k in enumerate(in_bucket)]
    assert up.checkpoint(2, changes) is CommitOutcome.COMMITTED
    last = up.engine.last
    assert last is not None and last.files_read == 1 and len(last.replaced) == 1
    ref: dict[int, Any] = {}
    apply_in_order(ref, upserts(range(2000), 0))
    apply_in_order(ref, changes)
    assert up.state() == ref


@pytest.mark.parametrize("theirs_apply", [pyiceberg_overwrite, pyiceberg_upsert], ids=["overwrite", "delete+upsert"])
def test_the_merge_gives_the_table_pyiceberg_gives(tmp_path: Path, theirs_apply: Any) -> None:
    """pyiceberg's one-call overwrite (the benchmark's peer) and its delete + upsert give sluice's table."""
    ours, theirs = iceberg(tmp_path, "ours"), iceberg(tmp_path / "other")
    (tmp_path / "other").mkdir(exist_ok=True)
    rng = random.Random(21)
    first = random_stream(rng, 300, 100, 0)
    ours.checkpoint(1, first)
    theirs.checkpoint(1, first)
    for cid in range(2, 5):
        changes = collapse(as_table(random_stream(rng, 300, 100, cid * 1000)), ["id"])
        assert ours.engine.apply(cid, changes) is CommitOutcome.COMMITTED
        theirs_apply(theirs.load_iceberg(None), changes, ["id"], {"sluice.max-committed-checkpoint-id": str(cid)})
        assert ours.state() == table_state(theirs.target.read()), f"the tables differ after checkpoint {cid}"


def test_the_merge_holds_the_rewrite_lock_for_its_whole_run(tmp_path: Path) -> None:
    up = iceberg(tmp_path)
    lock = threading.Lock()
    up.engine = up.make_engine(lock=lock)
    held: list[bool] = []
    up.checkpoint(1, upserts(range(10), 0))
    files = [up.stage(2, as_table(upserts(range(5, 15), 100, "w")))]
    assert up.commit(2, files, lambda point: held.append(lock.locked())) is CommitOutcome.COMMITTED
    assert held == [True]
    assert not lock.locked()


def test_a_new_table_is_created_from_the_changes_and_rows_deleted_before_ever_landing_never_appear(tmp_path: Path) -> None:
    up = iceberg(tmp_path)
    engine = up.engine
    assert isinstance(engine, IcebergUpsert) and engine.committed() == 0  # no table yet
    changes = [Change(1, Op.INSERT, "a", 1.0, 1), Change(1, Op.DELETE, None, None, 2), Change(2, Op.READ, "b", 2.0, 3)]
    assert up.checkpoint(1, changes) is CommitOutcome.COMMITTED
    assert up.state() == {2: ("b", 2.0)}


def test_an_update_of_a_key_two_files_hold_lands_once(tmp_path: Path) -> None:
    """A table appended to before its upserts may hold a key twice: the update replaces both rows by one."""
    up = iceberg(tmp_path)
    up.checkpoint(1, upserts(range(10), 0))
    table = up.load_iceberg(None)
    table.append(pa.table({"id": pa.array([5], pa.int64()), "name": ["dup"], "amount": [0.0]}).cast(table.schema().as_arrow()))
    assert up.checkpoint(2, [Change(5, Op.UPDATE, "once", 5.5, 100)]) is CommitOutcome.COMMITTED
    last = up.engine.last
    assert last is not None and len(last.replaced) == 2
    assert up.state()[5] == ("once", 5.5)  # table_state fails on a duplicated key


def test_string_and_date_keys_prune_by_their_bounds(tmp_path: Path) -> None:
    import datetime

    up = Upserts(Target("iceberg", str(tmp_path / "lake"), {}, str(tmp_path)), keys=("day", "sku"))

    def batch(day: int, skus: list[str], op: Op, start: int) -> pa.Table:
        body = pa.table({"day": pa.array([datetime.date(2024, 1, day)] * len(skus), pa.date32()), "sku": skus,
                         "qty": pa.array(range(len(skus)), pa.int64())})
        return change_table(body, [int(op)] * len(skus), range(start, start + len(skus)))

    for i, day in enumerate((1, 2, 3)):  # one file per day, each holding skus a.. to z..
        f = up.stage(i + 1, batch(day, [f"{c}-sku" for c in "acegikmoqsuwy"], Op.INSERT, i * 100))
        assert up.commit(i + 1, [f]) is CommitOutcome.COMMITTED
    f = up.stage(4, batch(2, ["k-sku", "zz"], Op.UPDATE, 1000))  # day 2 only; "zz" is past every file's range
    assert up.commit(4, [f]) is CommitOutcome.COMMITTED
    last = up.engine.last
    assert last is not None and last.files_read == 1 and len(last.replaced) == 1
    f = up.stage(5, batch(2, ["b-sku"], Op.DELETE, 2000))  # within day 2's range, absent: read, not replaced
    assert up.commit(5, [f]) is CommitOutcome.COMMITTED
    assert up.engine.last is not None and up.engine.last.files_read == 1 and not up.engine.last.replaced
    rows = {(r["day"].day, r["sku"]): r["qty"] for r in up.target.read().to_pylist()}
    assert len(rows) == 3 * 13 + 1 and rows[(2, "zz")] == 1 and rows[(2, "k-sku")] == 0
