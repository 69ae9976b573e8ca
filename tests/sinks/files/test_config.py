"""Build-time validation and bucket assignment."""

from __future__ import annotations

import pyarrow as pa
import pytest
from sluice import ConfigError, Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.sinks.files import CompactionPolicy, FileSink, RollingPolicy
from sluice.sinks.files.buckets import NULL_PARTITION, BucketAssigner
from sluice.sinks.files.committable import (
    committed_checkpoint_of,
    final_name,
    is_staging_of,
    is_upload_of,
    staging_name,
)


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"format": "avro"}, ["format", "parquet, json, csv", "'avro'"]),
        ({"compression": "lzma"}, ["compression", "snappy", "zstd", "'lzma'"]),
        ({"format": "json", "compression": "snappy"}, ["compression", "none, gzip"]),
        ({"rolling": RollingPolicy(max_size=0)}, ["rolling.max_size", ">= 1"]),
        ({"rolling": {"rollover_interval": -1}}, ["rolling.rollover_interval", "> 0"]),
        ({"rolling": {"inactivity_interval": "soon"}}, ["rolling.inactivity_interval", "is not a duration"]),
        ({"rolling": {"max_bytes": 1}}, ["rolling", "max_bytes"]),
        ({"compaction": CompactionPolicy(target_size=0)}, ["compaction.target_size"]),
        ({"compaction": {"max_checkpoints": 0}}, ["compaction.max_checkpoints", ">= 1"]),
        ({"row_group_size": 0}, ["row_group_size"]),
        ({"part_size": 1024}, ["part_size", "5242880"]),
        ({"bucket_by": ["_hidden"]}, ["bucket_by", "'_hidden'"]),
        ({"time_bucket": ".dt=%Y"}, ["time_bucket", "hidden"]),
        ({"time_column": "ts"}, ["time_column", "time_bucket"]),
        ({"schema_evolution": "yes"}, ["schema_evolution"]),
    ],
)
def test_invalid_options_name_the_option_and_allowed_values(tmp_path, kwargs, names) -> None:
    with pytest.raises(ConfigError) as err:
        FileSink(str(tmp_path), **kwargs)
    for n in names:
        assert n in str(err.value)


def test_s3_options_are_checked_and_never_shown(tmp_path) -> None:
    with pytest.raises(ConfigError, match="endpoint"):
        FileSink("s3://bkt/x", storage_options={"endpoint": "http://x"})
    with pytest.raises(ConfigError, match="path"):
        FileSink("gs://bkt/x")
    sink = FileSink("s3://bkt/x", storage_options={"aws_secret_access_key": "s3cr3t"})
    assert "s3cr3t" not in repr(sink)


def test_validate_runs_when_the_pipeline_is_built(tmp_path) -> None:
    sink = FileSink(str(tmp_path))
    sink.format = "orc"
    p = Pipeline("v")
    with pytest.raises(ConfigError, match="format"):
        p.source(GeneratorSource()).sink(sink)


def test_buckets_hive_style_with_escaping_and_nulls() -> None:
    batch = pa.record_batch({"country": ["de", "a/b", None, "de"], "n": [1, 2, 3, 4]})
    parts = dict(BucketAssigner(["country"]).split(batch))
    assert sorted(parts) == ["country=__HIVE_DEFAULT_PARTITION__", "country=a%2Fb", "country=de"]
    assert NULL_PARTITION in next(iter(k for k in parts if "HIVE" in k))
    assert parts["country=de"].column("n").to_pylist() == [1, 4]
    assert parts["country=de"].schema.names == ["n"]  # the bucket column lives in the path


def test_event_time_buckets_from_epoch_millis() -> None:
    batch = pa.record_batch({"k": [1, 2], "ts": [1_600_000_000_000, 1_600_000_000_000 + 3_600_000]})
    got = dict(BucketAssigner(["k"], "dt=%Y-%m-%d/hour=%H", "ts").split(batch))
    assert sorted(got) == ["k=1/dt=2020-09-13/hour=12", "k=2/dt=2020-09-13/hour=13"]


def test_processing_time_bucket_uses_utc_now() -> None:
    batch = pa.record_batch({"v": [1, 2, 3]})
    got = BucketAssigner([], "dt=%Y-%m-%d").split(batch, now=0.0)
    assert got == [("dt=1970-01-01", batch)]


def test_names_are_unambiguous_between_jobs_sharing_a_prefix() -> None:
    final = final_name("b=1", "job-1", 7, 0, "0003", ".parquet", "0123456789ab")
    assert final == "b=1/part-job-1-000007-000-0003-0123456789ab.parquet"
    hidden = staging_name(final, 2, "pending").rsplit("/", 1)[1]
    assert hidden.startswith(".") and is_staging_of(hidden, "job-1")
    assert not is_staging_of(hidden, "job")
    for name in ("part-job-1-000007-000-c001-0123456789ab.parquet", "part-job-1-000007-000-c001.parquet"):
        assert is_upload_of(name, "job-1") and not is_upload_of(name, "job")  # (and names without a run token)
        assert committed_checkpoint_of(name, "job-1") == 7 and committed_checkpoint_of(name, "job") is None
    assert committed_checkpoint_of(".part-job-1-000007-000-0003-0123456789ab.parquet.a2.pending", "job-1") is None
