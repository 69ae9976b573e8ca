"""The change model: the collapse to the last change per key (against a dict applied in order and against a
DuckDB window query), bad change batches refused by name, staged change files read back across writers and
checkpoints, and the cleanup of staged files no commit will read."""

from __future__ import annotations

import random
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from sluice.errors import is_recoverable
from sluice.sinks.tables.changes import (
    CHANGES_DIR,
    OP,
    ORDER,
    ChangeError,
    Op,
    change_table,
    collapse,
    delete_staged,
    read_staged,
    remove_orphaned_changes,
    stage_changes,
    upserts_and_deletes,
)
from sluice.sinks.tables.files import data_file_name


def last_by_dict(rows: list[tuple[int, Op, int]], orders: list[int]) -> dict[int, tuple[int, int]]:
    """The reference: walk the changes in source order, remembering each key's latest (op, value)."""
    out: dict[int, tuple[int, int]] = {}
    for _, (key, op, value) in sorted(zip(orders, rows, strict=True), key=lambda p: p[0]):
        out[key] = (int(op), value)
    return out


def test_collapse_keeps_the_last_change_per_key_in_source_order() -> None:
    for seed in range(200):
        rng = random.Random(seed)
        rows = [(rng.randrange(9), rng.choice(list(Op)), rng.randrange(-5, 6)) for _ in range(rng.randrange(61))]
        orders = rng.sample(range(1000), len(rows))  # unique, in no particular relation to arrival
        arrival = list(range(len(rows)))
        rng.shuffle(arrival)  # rows arrive in any order: the order column decides
        table = change_table(
            pa.table({"k": pa.array([rows[i][0] for i in arrival], pa.int64()), "v": [rows[i][2] for i in arrival]}),
            [int(rows[i][1]) for i in arrival],
            [orders[i] for i in arrival],
        )
        out = collapse(table, ["k"])
        got = {k: (op, v) for k, op, v in zip(*(out.column(c).to_pylist() for c in ("k", OP, "v")), strict=True)}
        assert got == last_by_dict(rows, orders), f"seed {seed}"
        assert out.column("k").to_pylist() == sorted(got), "the collapsed changes are sorted by key"


def test_collapse_agrees_with_a_duckdb_window_query_on_a_composite_key_with_ties() -> None:
    rng = random.Random(3)
    n = 5000
    table = change_table(
        pa.table(
            {
                "region": [rng.choice(["eu", "us", "ap"]) for _ in range(n)],
                "id": [rng.randrange(50) for _ in range(n)],
                "v": list(range(n)),  # the arrival position
            }
        ),
        [rng.choice(list(Op)) for _ in range(n)],
        [rng.randrange(200) for _ in range(n)],  # many equal orders: the later arrival wins
    )
    out = collapse(table, ["region", "id"])
    con = duckdb.connect()
    con.register("changes", table)
    ref = con.sql(
        f"""select region, id, v, {OP} from changes
            qualify row_number() over (partition by region, id order by {ORDER} desc, v desc) = 1"""
    ).to_arrow_table()
    assert out.num_rows == ref.num_rows
    key = [("region", "ascending"), ("id", "ascending")]
    assert out.select(["region", "id", "v", OP]).sort_by(key).equals(ref.sort_by(key).cast(out.select(["region", "id", "v", OP]).schema))


def test_bad_change_batches_are_refused_naming_the_column() -> None:
    good = change_table(pa.table({"k": [1, 2], "v": ["a", "b"]}), [0, 1], [1, 2])
    with pytest.raises(ChangeError, match=r"key column\(s\) \['id'\]"):
        collapse(good, ["id"])
    with pytest.raises(ChangeError, match="null 'k'"):
        collapse(change_table(pa.table({"k": [1, None]}), [0, 0], [1, 2]), ["k"])
    with pytest.raises(ChangeError, match=f"null '{OP}'"):
        collapse(change_table(pa.table({"k": [1, 2]}), [0, None], [1, 2]), ["k"])
    with pytest.raises(ChangeError, match=f"lack the {OP}"):
        collapse(good.drop_columns([OP]), ["k"])
    with pytest.raises(ChangeError, match="values outside"):
        collapse(change_table(pa.table({"k": [1]}), [9], [1]), ["k"])
    with pytest.raises(ChangeError, match=f"{ORDER} column has type string"):
        collapse(good.set_column(good.schema.get_field_index(ORDER), ORDER, pa.array(["1", "2"])), ["k"])
    assert not is_recoverable(ChangeError("x")), "a bad batch fails again after a restart"


def test_upserts_and_deletes_split_by_the_last_operation() -> None:
    collapsed = collapse(change_table(pa.table({"k": [1, 2, 3], "v": ["a", None, "c"]}), [0, 2, 3], [1, 2, 3]), ["k"])
    upserts, deletes = upserts_and_deletes(collapsed)
    assert upserts.column_names == ["k", "v"]
    assert upserts.column("k").to_pylist() == [1, 3] and deletes.column("k").to_pylist() == [2]


def stage(fs: pafs.FileSystem, root: str, ckpt: int, sub: int, table: pa.Table, job: str = "job") -> object:
    name = data_file_name(job, ckpt, sub, 0, 0, "0123456789ab")
    return stage_changes(fs, root, name, collapse(table, ["k"]), ckpt)


def test_staged_files_of_several_writers_and_checkpoints_read_back_as_one_collapse(tmp_path: Path) -> None:
    fs, root = pafs.LocalFileSystem(), str(tmp_path)
    a = stage(fs, root, 3, 0, change_table(pa.table({"k": [1, 2], "v": ["a3", "b3"]}), [0, 0], [10, 11]))
    b = stage(fs, root, 3, 1, change_table(pa.table({"k": [2, 3], "v": ["b3'", "c3"]}), [1, 0], [12, 5]))
    # checkpoint 4 (a failed checkpoint 3's changes are committed with the next one): it wins even with a
    # lower order value, and it brings a column the older files lack
    c = stage(fs, root, 4, 0, change_table(pa.table({"k": [1, 3], "v": ["a4", None], "w": [7, 8]}), [1, 2], [1, 2]))
    out = read_staged(fs, root, [c, a, b], ["k"])  # in any order
    assert out.column("k").to_pylist() == [1, 2, 3]
    assert out.column("v").to_pylist() == ["a4", "b3'", None]
    assert out.column("w").to_pylist() == [7, None, 8]
    assert out.column(OP).to_pylist() == [Op.UPDATE, Op.UPDATE, Op.DELETE]
    assert delete_staged(fs, root, [a, b, c]) == 3
    assert delete_staged(fs, root, [a]) == 0  # already gone: nothing to do
    assert not list((tmp_path / CHANGES_DIR).iterdir())


def test_staged_files_no_commit_will_read_are_deleted_and_the_rest_kept(tmp_path: Path) -> None:
    fs, root = pafs.LocalFileSystem(), str(tmp_path)
    t = change_table(pa.table({"k": [1]}), [0], [1])
    applied = stage(fs, root, 2, 0, t)  # the table holds checkpoint 2: applied
    restored = [stage(fs, root, 3, 0, t), stage(fs, root, 4, 1, t)]  # checkpoint 4 restored, 3 carried in it
    never = stage(fs, root, 5, 0, t)  # checkpoint 5 never completed
    other_job = stage(fs, root, 9, 0, t, job="other")
    stray = stage(fs, root, 3, 1, t)  # of checkpoint 3, in no checkpoint (say, staged again by a zombie)
    assert remove_orphaned_changes(fs, root, "job", committed=2, restored=4) == 2  # without the list
    assert (tmp_path / stray.path).exists()  # type: ignore[attr-defined]
    removed = remove_orphaned_changes(fs, root, "job", committed=2, restored=4, keep={f.path for f in restored})  # type: ignore[attr-defined]
    assert removed == 1
    left = {p.name for p in (tmp_path / CHANGES_DIR).iterdir()}
    assert left == {Path(f.path).name for f in [*restored, other_job]}  # type: ignore[attr-defined]
    assert Path(applied.path).name not in left and Path(never.path).name not in left  # type: ignore[attr-defined]


def test_a_writer_holding_many_live_keys_does_not_collapse_its_buffer_at_every_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With more live keys than ``collapse_rows``, a collapse leaves the buffer above the threshold: the next
    one waits until the buffer doubled (it used to run at every batch, a whole-buffer sort each time)."""
    import pyarrow.parquet as pq
    from sluice.changes import OP, ORDER
    from sluice.sinks.tables.change_writer import ChangeWriter

    from tests.sinks.conftest import Ctx

    fs = pafs.LocalFileSystem()
    writer = ChangeWriter(lambda schema: (fs, str(tmp_path)), ["id"], Ctx(), collapse_rows=10)  # type: ignore[arg-type]
    calls = 0
    inner = writer._collapsed

    def counted() -> pa.Table:
        nonlocal calls
        calls += 1
        return inner()

    monkeypatch.setattr(writer, "_collapsed", counted)
    rng = random.Random(3)
    last: dict[int, int] = {}
    for order in range(2000):  # 200 live keys, one change per batch
        key = rng.randrange(200)
        last[key] = order
        writer.write(change_table(pa.table({"id": [key], "v": [order]}), [1], [order]).to_batches()[0])
    assert calls < 40, f"{calls} collapses for 2000 batches"
    (staged,) = writer.prepare_commit(1)
    got = pq.read_table(f"{tmp_path}/{staged.path}")
    assert dict(zip(got.column("id").to_pylist(), got.column("v").to_pylist(), strict=True)) == last
    assert OP in got.column_names and ORDER in got.column_names
