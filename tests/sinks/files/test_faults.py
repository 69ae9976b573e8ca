"""Exactly-once under injected crashes: GeneratorSource -> (key_by/process) -> FileSink, on local disk and S3.

Each case crashes once at a named point (compaction, final checkpoint, between completion and commit, in
the middle of a commit, between snapshot and ack), restarts from the latest completed checkpoint, and
checks that readers see exactly the generator's rows and no hidden or pending file.
"""

from __future__ import annotations

import os
import random
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from sluice import CheckpointConfig, FixedDelayRestart, KeyedProcessFunction, Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.sinks.files import CompactionPolicy, FileSink, RollingPolicy
from sluice.testing.faults import FaultInjector

from tests.sinks.conftest import MotoS3, local_files, read_visible, s3_keys, same_rows

POINTS = ("compaction", "final_checkpoint", "complete_to_commit", "commit", "snapshot_to_ack")
LOCAL_CASES = [(POINTS[i % len(POINTS)], 100 + i) for i in range(15)]
S3_CASES = [(POINTS[i % len(POINTS)], 200 + i) for i in range(10)]


class Identity(KeyedProcessFunction):
    def process(self, key: Any, rows: pa.RecordBatch, ctx: Any) -> pa.RecordBatch:
        return rows


def with_bucket(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch.append_column("b", pc.bit_wise_and(batch.column("key"), 3))


def run(
    seed: int, point: str, root: str, chk: str, storage_options: dict[str, Any] | None = None
) -> tuple[GeneratorSource, FaultInjector, str, Any]:
    rng = random.Random(seed)
    src = GeneratorSource(
        num_splits=rng.randint(1, 3),
        records_per_split=rng.choice([300, 500]),
        batch_size=rng.choice([20, 50]),
        rows_per_second=rng.choice([600, 1000]),
    )
    fmt = rng.choice(["parquet", "parquet", "json", "csv"])
    p = Pipeline(
        f"fs-{seed}",
        parallelism=rng.randint(1, 2),
        checkpoint=CheckpointConfig(interval=rng.choice([0.05, 0.1]), storage=chk),
        restart=FixedDelayRestart(attempts=5, delay=0),
    )
    s = p.source(src).map_batches(with_bucket)
    if rng.random() < 0.5:
        s = s.key_by("b").process(Identity())
    s.sink(
        FileSink(
            root,
            format=fmt,
            bucket_by=["b"],
            rolling=RollingPolicy(max_size=rng.choice([1500, 6000])),
            compaction=CompactionPolicy(
                target_size=rng.choice([4000, 10**6]), max_checkpoints=rng.choice([1, 1, 2])
            ),
            storage_options=storage_options,
            multipart_threshold=rng.choice([1, 10**6]),
        )
    )
    # small enough to fire however few checkpoints a fast run takes (a single task hits some points only once)
    after = rng.randint(0, 1) if point in ("compaction", "commit") else 0
    faults = FaultInjector(point=point, after=after)
    result = p.run(runtime="local", faults=faults, restore="none")
    return src, faults, fmt, result


@pytest.mark.faults
@pytest.mark.parametrize(("point", "seed"), LOCAL_CASES)
def test_exactly_once_on_local_disk(tmp_path, point, seed) -> None:
    root = str(tmp_path / "out")
    src, faults, fmt, result = run(seed, point, root, str(tmp_path / "chk"))
    assert faults.fired, f"the fault at {point} never fired"
    assert result.attempts >= 2
    same_rows(read_visible(root, fmt), src.expected())
    hidden = [f for f in local_files(root) if os.path.basename(f).startswith(".")]
    assert not hidden, f"staging files left after the job finished: {hidden}"


@pytest.mark.faults
@pytest.mark.s3
@pytest.mark.parametrize(("point", "seed"), S3_CASES)
def test_exactly_once_on_s3(moto_s3: MotoS3, tmp_path, point, seed) -> None:
    bucket = moto_s3.new_bucket()
    src, faults, fmt, result = run(
        seed, point, f"s3://{bucket}/tbl", str(tmp_path / "chk"), moto_s3.options()
    )
    assert faults.fired, f"the fault at {point} never fired"
    assert result.attempts >= 2
    same_rows(read_visible(f"{bucket}/tbl", fmt, moto_s3.arrow_fs()), src.expected())
    hidden = [k for k in s3_keys(moto_s3, bucket) if os.path.basename(k).startswith(".")]
    assert not hidden, f"staging objects left after the job finished: {hidden}"
    uploads = moto_s3.client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert not uploads, f"multipart uploads left open: {[u['Key'] for u in uploads]}"
