"""DeltaSink and IcebergSink in ``mode="upsert"`` as a job uses them: the options checked when the sink is
built (one-line errors naming the option and the allowed values), key columns given or taken from the
change format's schema metadata, a column the source table gained carried into the table with
``schema_mode="merge"`` (refused in strict mode), Iceberg bucketed by the key, and the background rewrite
running next to the merges. Every table is compared with the change stream applied in order to a dict
(tests/sinks/tables/cdc.py), every version with a checkpoint's cut of it."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from sluice import CheckpointConfig, ConfigError, FixedDelayRestart, JobFailedError, Pipeline
from sluice.changes import OP, ORDER, with_keys
from sluice.sinks.delta import DeltaSink
from sluice.sinks.iceberg import IcebergSink

from tests.sinks.tables.cdc import (
    KEYS_PER_SPLIT,
    PlainStream,
    Stream,
    change_rows,
    check_versions,
    pipeline,
    table_state,
    version_states,
)
from tests.sinks.tables.helpers import Target
from tests.sinks.tables.paced import Paced

CHANGES = with_keys(
    pa.schema([("id", pa.int64()), ("name", pa.string()), (OP, pa.int8()), (ORDER, pa.int64())]).empty_table(), ["id"]
).schema
PLAIN = CHANGES.remove_metadata()  # a change stream that does not name its keys
ROWS = pa.schema([("id", pa.int64()), ("name", pa.string())])  # plain rows


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: DeltaSink("/tmp/x", mode="merge"), "DeltaSink: mode must be one of append, upsert (got 'merge')"),
        (lambda: IcebergSink("db.t", warehouse="/tmp/w", mode="x"), "IcebergSink: mode must be one of append, upsert"),
        (lambda: DeltaSink("/tmp/x", key_columns=["id"]), "DeltaSink: key_columns is for mode='upsert' only (got mode='append')"),
        (lambda: DeltaSink("/tmp/x", mode="upsert", key_columns=["id", "id"]), "key_columns must be distinct column names"),
        (lambda: IcebergSink("db.t", warehouse="/tmp/w", mode="upsert", key_columns=[""]), "key_columns must be distinct column"),
        (
            lambda: DeltaSink("/tmp/x", mode="upsert", key_columns=["k"], schema=pa.schema([("id", pa.int64())])),
            "key_columns names column(s) ['k'] not in schema",
        ),
        (lambda: DeltaSink("/tmp/x", mode="upsert").validate_schema(PLAIN), "mode='upsert' needs key_columns=[...]"),
        (
            lambda: IcebergSink("db.t", warehouse="/tmp/w", mode="upsert", key_columns="k").validate_schema(CHANGES),
            "the stream lacks ['k']",
        ),
        (
            lambda: DeltaSink("/tmp/x", mode="upsert", key_columns="k").validate_schema(ROWS),
            "mode='upsert' takes rows with the key column(s) ['k']; the stream lacks ['k']",
        ),
        (  # the old names: one line naming the new one
            lambda: DeltaSink("/tmp/x", mode="upsert", keys=["id"]),
            "DeltaSink: keys= is now key_columns= (one name for the key columns of every sink): key_columns=['id']",
        ),
        (
            lambda: IcebergSink("db.t", warehouse="/tmp/w", mode="upsert", keys="id"),
            "IcebergSink: keys= is now key_columns=",
        ),
        (
            lambda: DeltaSink("/tmp/x", mode="upsert").validate_schema(CHANGES.remove(3)),
            f"the stream lacks ['{ORDER}']",
        ),
        (
            lambda: IcebergSink("db.t", warehouse="/tmp/w", mode="upsert", partition_by=["bucket(4, nope)"])
            .validate_schema(CHANGES),
            "partition_by names column(s) ['nope']",
        ),
    ],
)
def test_wrong_upsert_options_name_the_option_in_one_line(build: Any, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        build()
    assert message in str(info.value) and "\n" not in str(info.value)


def test_keys_given_or_named_by_the_change_format_pass_the_build_checks() -> None:
    DeltaSink("/tmp/x", mode="upsert").validate_schema(CHANGES)  # keys from the schema's metadata
    DeltaSink("/tmp/x", mode="upsert", key_columns="id").validate_schema(PLAIN)
    sink = IcebergSink("db.t", warehouse="/tmp/w", mode="upsert", key_columns=["id"], partition_by=["bucket(8, id)"])
    sink.validate_schema(PLAIN)
    assert sink.key_columns == ["id"] and sink.mode == "upsert" and "mode='upsert'" in repr(sink)
    # plain rows cross a hash exchange on the key columns; a change stream keeps its partitioning
    sink.validate_schema(ROWS)
    assert sink.input_key_columns(ROWS) == ["id"] and sink.input_key_columns(None) == ["id"]
    assert sink.input_key_columns(PLAIN) is None and DeltaSink("/tmp/x").input_key_columns(None) is None


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_keys_given_to_the_sink_when_the_stream_names_none(kind: str, tmp_path: Path) -> None:
    target = Target(kind, str(tmp_path / "lake"), {}, str(tmp_path))
    stream = Stream(splits=2, per_split=100)
    q = Pipeline("plain", checkpoint=CheckpointConfig(interval=0.05, storage=str(tmp_path / "chk")))
    q.source(stream.source(), parallelism=2).map_batches(  # the change format's metadata removed
        lambda b: b.replace_schema_metadata(None)
    ).sink(target.sink(mode="upsert", key_columns=["id"]), parallelism=2)
    q.run(runtime="local")
    assert table_state(target.read()) == stream.final()


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_plain_rows_upsert_their_key(kind: str, tmp_path: Path) -> None:
    """Plain rows (no change columns: a keyed JSON topic, a window's results) into ``mode="upsert",
    key_columns=["id"]``: each row an upsert of its key. The table equals the last row per key of the input
    (a dict the rows are written into in order), and every version is a checkpoint's cut of it; the sink
    runs at another parallelism than the source, so the rows cross the hash exchange on the key columns
    that keeps a key's rows in one writer, in order. (Before, such a stream was refused at build time.)"""
    target = Target(kind, str(tmp_path / "lake"), {}, str(tmp_path))
    stream = PlainStream(splits=3, per_split=600, batch=4)  # a key recurs in many batches of one checkpoint
    sink = target.sink(mode="upsert", key_columns=["id"])
    p = pipeline(stream, sink, str(tmp_path), parallelism=3, rate=2000.0, sink_parallelism=2)
    assert p.run(runtime="local").status == "finished"
    assert table_state(target.read()) == stream.final() and len(stream.final()) == 3 * KEYS_PER_SPLIT
    assert check_versions(stream, target) >= 2


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_a_stream_naming_no_keys_into_a_sink_given_none_fails_at_once(kind: str, tmp_path: Path) -> None:
    target = Target(kind, str(tmp_path / "lake"), {}, str(tmp_path))
    q = Pipeline(
        "nokeys",
        checkpoint=CheckpointConfig(interval=0.05, storage=str(tmp_path / "chk")),
        restart=FixedDelayRestart(attempts=3, delay=0.0),
    )
    q.source(Stream(splits=1, per_split=50).source()).map_batches(
        lambda b: b.replace_schema_metadata(None)
    ).sink(target.sink(mode="upsert"))
    with pytest.raises(JobFailedError, match="no key_columns="):
        q.run(runtime="local")


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_a_column_the_source_gained_joins_the_table_in_merge_mode(kind: str, tmp_path: Path) -> None:
    target = Target(kind, str(tmp_path / "lake"), {}, str(tmp_path))
    stream = Stream(splits=2, per_split=240, batch=20, extra=120)  # changes 120.. carry the column ``note``
    result = pipeline(stream, target.sink(mode="upsert", schema_mode="merge"), str(tmp_path), rate=400.0).run(
        runtime="local"
    )
    assert result.status == "finished"
    table = target.read()
    assert table_state(table) == stream.final()
    assert table.schema.field("note").nullable
    notes = dict(zip(table.column("id").to_pylist(), table.column("note").to_pylist(), strict=True))
    expected: dict[int, str | None] = {}
    for split in range(stream.splits):
        b = change_rows(split, 0, stream.per_split)
        for seq, (key, op) in enumerate(zip(b.column("id").to_pylist(), b.column(OP).to_pylist(), strict=True)):
            expected[key] = None if op == 2 else (f"note-{seq}" if seq >= 120 else None)
    assert notes == {k: v for k, v in expected.items() if k in notes}
    check_versions(stream, target)


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_a_column_the_source_gained_is_refused_in_strict_mode_naming_the_option(kind: str, tmp_path: Path) -> None:
    target = Target(kind, str(tmp_path / "lake"), {}, str(tmp_path))
    stream = Stream(splits=1, per_split=80, batch=20, extra=40)
    # changes 0..39 in a checkpoint of their own, which creates the table without ``note`` (all 80 in the
    # first checkpoint, as a loaded machine had it, created the table with it: nothing to refuse)
    rows = functools.partial(change_rows, extra=40)
    src = Paced(num_splits=1, records_per_split=80, batch_size=20, rows=rows, name="changes", chunk_batches=2)
    p = pipeline(stream, target.sink(mode="upsert"), str(tmp_path), attempts=2, source=src)
    with pytest.raises(ConfigError, match="new columns \\['note'\\] \\(set schema_mode='merge' to add them\\)"):
        p.run(runtime="local")
    check_versions(stream, target)  # what landed before is a checkpoint's cut


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_the_background_rewrite_runs_next_to_the_merges_and_loses_no_change(kind: str, tmp_path: Path) -> None:
    """The table starts with small files of keys the stream never changes, which the rewrite merges while the
    job's merges commit next to it, each merge replacing the small files that hold its keys: a merge that
    loses a race runs again, a rewrite that loses one takes its turn holding the commit lock. The source ends
    its input only once a rewrite committed (it used to lose every race to 30 ms checkpoints on a loaded
    machine, and the job ended with none)."""
    target = Target(kind, str(tmp_path / "lake"), {}, str(tmp_path))
    stream = Stream(splits=3, per_split=300, batch=20)
    extra = {"partition_by": ["bucket(4, id)"]} if kind == "iceberg" else {}
    sink = target.sink(mode="upsert", rewrite={"every": 1, "min_files": 2, "target_size": 1 << 20}, **extra)
    seeded = seed_small_files(target, sink, files=6)
    result = pipeline(stream, sink, str(tmp_path), rate=200.0, interval=0.03, until=target.rewrote).run(
        runtime="local"
    )
    assert result.status == "finished"
    assert table_state(target.read()) == {**stream.final(), **seeded}
    check_versions(stream, target)
    recorded = [cid for cid, _ in version_states(target) if cid is not None]
    assert recorded == sorted(set(recorded)), f"a checkpoint was applied twice: {recorded}"
    assert target.rewrites() >= 1, f"the background rewrite never committed: {result.metrics}"


def seed_small_files(target: Target, sink: Any, files: int) -> dict[int, Any]:
    """``files`` appends of keys from 100,000 on (no split's); returns their rows."""
    from sluice.sinks.iceberg.catalog import open_or_create

    rows: dict[int, Any] = {}
    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.float64())])
    for f in range(files):
        ids = list(range(100_000 + 10 * f, 100_010 + 10 * f))
        batch = pa.table({"id": ids, "name": [f"seed-{i}" for i in ids], "amount": [1.0 * i for i in ids]}, schema=schema)
        rows.update({i: (f"seed-{i}", 1.0 * i) for i in ids})
        if target.kind == "delta":
            from deltalake import write_deltalake

            write_deltalake(f"{target.root}/table", batch, mode="append")
        else:
            open_or_create(sink.options, schema).append(batch)
    return rows


def test_an_append_table_bucketed_by_a_column(tmp_path: Path) -> None:
    from sluice.connectors.generator import GeneratorSource

    target = Target("iceberg", str(tmp_path / "lake"), {}, str(tmp_path))
    q = Pipeline("bucketed", checkpoint=CheckpointConfig(interval=0.05, storage=str(tmp_path / "chk")))
    q.source(GeneratorSource(num_splits=2, records_per_split=300, batch_size=50)).sink(
        target.sink(partition_by=["bucket(4, id)"])
    )
    q.run(runtime="local")
    table = target.iceberg_table()
    assert [str(f.transform) for f in table.spec().fields] == ["bucket[4]"]
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == list(range(600))
    assert len(target.files_per_partition()) == 4
