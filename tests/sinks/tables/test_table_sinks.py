"""Delta and Iceberg sinks end to end: every row exactly once, one commit per checkpoint, one file per
partition and checkpoint with the compactor stage, the table created or checked, clear configuration errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from sluice import CheckpointConfig, ConfigError, JobFailedError, NoRestart, Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.sinks import load_sink
from sluice.sinks.delta import DeltaSink
from sluice.sinks.iceberg import IcebergSink
from sluice.sinks.tables import TableSchemaError

from tests.runtimes import spark_in_soak
from tests.sinks.tables.helpers import Target, completed, ids


def with_bucket(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch.append_column("b", pc.cast(pc.bit_wise_and(batch.column("id"), 3), pa.string()))


def run_job(
    target: Target, tmp: Path, runtime: str = "local", records: int = 1500, src: GeneratorSource | None = None, **sink: Any
) -> Any:
    src = src or GeneratorSource(num_splits=4, records_per_split=records, batch_size=50, rows_per_second=3000)
    p = Pipeline(
        "tables", parallelism=2, checkpoint=CheckpointConfig(interval=0.15, storage=str(tmp / "chk")), restart=NoRestart()
    )
    sink.setdefault("partition_by", ["b"])
    p.source(src).map_batches(with_bucket).sink(target.sink(**sink))
    return src, p.run(runtime=runtime, restore="none")


@spark_in_soak
def test_rows_land_exactly_once_one_file_per_partition_and_checkpoint(
    local_target: Target, tmp_path: Path, runtime: str
) -> None:
    src, result = run_job(local_target, tmp_path, runtime)
    expected = ids(src.expected())
    assert ids(local_target.read()) == expected
    assert ids(local_target.read_independently()) == expected
    n = completed(result)
    assert local_target.versions() <= n, f"{local_target.versions()} table versions for {n} completed checkpoints"
    per_partition = local_target.files_per_partition()
    assert len(per_partition) == 4 and max(per_partition.values()) <= n, per_partition
    assert result.metrics.get("commits", 0) >= 1


def test_without_compaction_every_subtask_writes_its_own_files(local_target: Target, tmp_path: Path) -> None:
    src, _result = run_job(local_target, tmp_path, compaction=False)
    assert ids(local_target.read()) == ids(src.expected())
    commits = local_target.versions()
    # two writer subtasks, four partitions: most checkpoints leave two files per partition
    assert max(local_target.files_per_partition().values()) > commits


def test_a_table_that_does_not_fit_the_stream_fails_the_job_naming_both_schemas(local_target: Target, tmp_path: Path) -> None:
    schema = pa.schema([("id", pa.int64()), ("b", pa.string()), ("other", pa.float64())])
    sink = local_target.sink(partition_by=["b"], schema=schema)
    sink.recover("someone-else", [])  # creates the table with its schema, as the job's driver would
    with pytest.raises((TableSchemaError, JobFailedError)) as err:
        run_job(local_target, tmp_path)
    text = str(err.value) + str(err.value.__cause__)
    assert "does not fit the table's schema" in text and "other" in text and "split" in text, text


def test_schema_mode_merge_adds_new_columns(local_target: Target, tmp_path: Path) -> None:
    schema = pa.schema([("id", pa.int64()), ("b", pa.string())])
    local_target.sink(partition_by=["b"], schema=schema).recover("creator", [])
    src, _ = run_job(local_target, tmp_path, schema_mode="merge")
    got = local_target.read()
    assert ids(got) == ids(src.expected())
    assert {"split", "value", "ts"} <= set(got.column_names)


def test_the_sinks_are_registered_entry_points() -> None:
    assert load_sink("delta") is DeltaSink
    assert load_sink("iceberg") is IcebergSink


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: DeltaSink("/tmp/x", schema_mode="loose"), "schema_mode must be one of strict, merge"),
        (lambda: DeltaSink("ftp://x"), "local folder, file:// or s3://"),
        (lambda: DeltaSink("/tmp/x", compression="brotli9"), "compression must be one of"),
        (lambda: DeltaSink("/tmp/x", rewrite={"every": 0}), "rewrite.every must be an integer >= 1"),
        (lambda: DeltaSink("/tmp/x", rewrite={"often": 1}), "rewrite:"),
        (lambda: DeltaSink("s3://b/t", storage_options={"conditional_put": "disabled"}), "conditional_put must be 'etag'"),
        (lambda: DeltaSink("/tmp/x", schema=pa.schema([("a", pa.int64())]), partition_by=["b"]), "partition_by names"),
        (lambda: IcebergSink("db.t", warehouse="/tmp/w", partition_by=["truncate(4, id)"]), "must be a column or one of"),
        (lambda: IcebergSink("db.t", warehouse="/tmp/w", partition_by=["bucket(id)"]), "bucket(n, col) with n >= 1"),
        (lambda: IcebergSink("db.t", warehouse="s3://bucket/w"), "give catalog_properties a 'uri'"),
        (lambda: IcebergSink("db.t", warehouse="/tmp/w", schema_mode="x"), "schema_mode must be one of"),
        (
            lambda: DeltaSink("/tmp/x", partition_by=["b"]).validate_schema(pa.schema([("a", pa.int64())])),
            "partition_by names column",
        ),
        (
            lambda: DeltaSink("/tmp/x", partition_by=["a"]).validate_schema(pa.schema([("a", pa.float64())])),
            "partition column 'a' has type double",
        ),
        (
            lambda: IcebergSink("db.t", warehouse="/tmp/w", partition_by=["day(t)"]).validate_schema(pa.schema([("a", pa.int64())])),
            "partition_by names column",
        ),
    ],
)
def test_wrong_options_name_the_option_and_the_allowed_values(build: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build()


def test_sinks_never_show_credentials() -> None:
    sink = DeltaSink("s3://b/t", storage_options={"aws_secret_access_key": "s3cr3t"})
    assert "s3cr3t" not in repr(sink)


def test_importing_sluice_loads_no_table_library() -> None:
    import subprocess
    import sys

    code = "import sluice, sluice.sinks.delta, sluice.sinks.iceberg, sys; print(sorted(m for m in ('deltalake', 'pyiceberg') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
