"""IcebergSink options checked before anything is written: a table without a namespace, a partition
transform its column's type cannot take (at build time when the stream's schema is known, else before the
table is created: never a table with an invalid spec), an existing table partitioned otherwise than the
sink asks (refused naming both specs, as the DeltaSink does)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from sluice import CheckpointConfig, ConfigError, NoRestart, Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.sinks.iceberg import IcebergSink
from sluice.sinks.tables import TableSchemaError

from tests.sinks.tables.helpers import Target, ids


def iceberg(tmp: Path) -> Target:
    return Target("iceberg", str(tmp / "lake"), {}, str(tmp))


def job(sink: Any, tmp: Path, known_schema: bool = True) -> tuple[GeneratorSource, Pipeline]:
    src = GeneratorSource(num_splits=2, records_per_split=200, batch_size=50)
    p = Pipeline("iceberg-options", checkpoint=CheckpointConfig(interval=0.1, storage=str(tmp / "chk")), restart=NoRestart())
    stream = p.source(src)
    if not known_schema:  # a function the job cannot see through: the schema is known only at run time
        stream = stream.map_batches(lambda b: b.append_column("t", pc.cast(b.column("ts"), pa.timestamp("ms"))))
    stream.sink(sink)
    return src, p


def test_a_table_without_a_namespace_is_refused_when_the_sink_is_built(tmp_path: Path) -> None:
    for name in ("events", "events.", "db..events"):
        with pytest.raises(ConfigError, match=r"table must be 'namespace.name' \(got"):
            IcebergSink(name, warehouse=str(tmp_path / "w"))


def test_a_time_transform_on_an_integer_column_is_refused_at_build_time(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        job(iceberg(tmp_path).sink(partition_by=["day(ts)"]), tmp_path)
    text = str(err.value)
    assert "\n" not in text and "day(ts)" in text and "long" in text and "date, timestamp" in text, text
    schema = pa.schema([("id", pa.int64()), ("ts", pa.int64())])
    with pytest.raises(ConfigError, match=r"hour\(ts\)"):
        iceberg(tmp_path).sink(partition_by=["hour(ts)"], schema=schema)
    assert not iceberg(tmp_path).exists()


def test_a_bad_transform_found_at_run_time_creates_no_table_and_the_fixed_job_runs(tmp_path: Path) -> None:
    target = iceberg(tmp_path)
    _, p = job(target.sink(partition_by=["day(ts)"]), tmp_path, known_schema=False)
    with pytest.raises(ConfigError, match=r"day\(ts\)"):  # fails at once, no restart spent
        p.run(runtime="local", restore="none")
    assert not target.exists(), "a table with an invalid partition spec was created"
    src, fixed = job(target.sink(partition_by=["day(t)"]), tmp_path, known_schema=False)
    fixed.run(runtime="local", restore="none")
    assert ids(target.read()) == ids(src.expected())
    assert [str(f.transform) for f in target.iceberg_table().spec().fields] == ["day"]


def test_an_existing_table_partitioned_otherwise_is_refused_naming_both_specs(tmp_path: Path) -> None:
    target = iceberg(tmp_path)
    schema = GeneratorSource().output_schema  # the stream's
    target.sink(partition_by=["split"], schema=schema).recover("creator", [])  # the table, by split
    _, p = job(target.sink(partition_by=["key"]), tmp_path)
    with pytest.raises(TableSchemaError) as err:
        p.run(runtime="local", restore="none")
    text = str(err.value)
    assert "\n" not in text and "partitioned by [split]" in text and "the sink by [key]" in text, text
    assert target.read().num_rows == 0 and len(target.iceberg_table().snapshots()) == 0
    src, same = job(target.sink(), tmp_path)  # no partition_by: the table's spec is used
    same.run(runtime="local", restore="none", allow_reprocessing=True)
    assert ids(target.read()) == ids(src.expected())


def test_the_docs_name_the_transforms_the_sink_takes() -> None:
    """docs/tables.md's Limits list the Iceberg transforms offered and those not offered: as the code has them
    (it said bucket was not offered while the same page offered it, as the code does)."""
    import re

    from sluice.sinks.iceberg.partitioning import TRANSFORMS

    text = " ".join((Path(__file__).resolve().parents[3] / "docs" / "tables.md").read_text().split())
    m = re.search(r"Iceberg transforms: (.+?) \(([^()]+?) (?:is|are) not offered\)", text)
    assert m, "docs/tables.md no longer lists the Iceberg transforms in its Limits"
    names = r"\b(identity|year|month|day|hour|bucket|truncate|void)\b"
    offered, refused = set(re.findall(names, m[1])), set(re.findall(names, m[2]))
    assert offered == set(TRANSFORMS) and not refused & set(TRANSFORMS), (offered, refused)
