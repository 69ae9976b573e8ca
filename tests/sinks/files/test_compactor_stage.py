"""The compactor stage: the files every writer subtask staged for one bucket at checkpoint n merge into one
file before n completes (Flink's compacting FileSink), in every checkpoint mode, exactly once."""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

import pytest
from sluice import CheckpointConfig, Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.sinks.files import CompactionPolicy, FileSink, RollingPolicy

from tests.sinks.conftest import local_files, read_visible
from tests.sinks.files.test_faults import with_bucket

NAME = re.compile(r"part-.+-(\d{6})-(\d{3})-(c?\d+)-[0-9a-f]{12}\.parquet$")


def run(tmp: Path, compaction: bool, runtime: str = "local", **checkpoint: object) -> tuple[GeneratorSource, Counter[tuple[str, str]]]:
    src = GeneratorSource(num_splits=4, records_per_split=1500, batch_size=25, rows_per_second=2500)
    p = Pipeline(
        "compactor-stage",
        parallelism=3,
        checkpoint=CheckpointConfig(interval=0.2, storage=str(tmp / "chk"), **checkpoint),  # type: ignore[arg-type]
    )
    s = p.source(src, parallelism=2).rebalance(parallelism=3).map_batches(with_bucket)
    s.sink(
        FileSink(
            str(tmp / "out"),
            format="parquet",
            bucket_by=["b"],
            rolling=RollingPolicy(max_size=4000),
            compaction=CompactionPolicy(target_size=10**8) if compaction else None,
        )
    )
    p.run(runtime=runtime, restore="none")  # type: ignore[arg-type]
    per_bucket_checkpoint: Counter[tuple[str, str]] = Counter()
    for f in local_files(str(tmp / "out")):
        m = NAME.search(os.path.basename(f))
        assert m, f
        per_bucket_checkpoint[(os.path.basename(os.path.dirname(f)), m.group(1))] += 1
    return src, per_bucket_checkpoint


@pytest.mark.parametrize(
    "checkpoint", [{}, {"unaligned": True}, {"aligned_checkpoint_timeout": 0.0}], ids=["aligned", "unaligned", "adaptive"]
)
def test_all_writers_files_of_a_bucket_merge_into_one_per_checkpoint(tmp_path: Path, checkpoint: dict) -> None:  # type: ignore[type-arg]
    src, files = run(tmp_path / "with", True, **checkpoint)
    got = read_visible(str(tmp_path / "with" / "out"))
    assert sorted(got.column("id").to_pylist()) == sorted(src.expected().column("id").to_pylist())
    assert files and max(files.values()) == 1, f"more than one file for a bucket and checkpoint: {files}"


def test_without_compaction_every_writer_leaves_its_own_files(tmp_path: Path) -> None:
    _, files = run(tmp_path, False)
    assert max(files.values()) > 1


@pytest.mark.spark
def test_compactor_stage_on_spark(spark: object, tmp_path: Path) -> None:
    src, files = run(tmp_path, True, runtime="spark")
    got = read_visible(str(tmp_path / "out"))
    assert sorted(got.column("id").to_pylist()) == sorted(src.expected().column("id").to_pylist())
    assert max(files.values()) == 1, files
