"""A Kafka -> Parquet-like job: a rate-limited source, checkpoints every second, compaction on.

Every checkpoint leaves at most one visible file per bucket (each bucket is written by one subtask after
``key_by``), however many small files the rolling policy produced in between.
"""

from __future__ import annotations

import collections
import os
import re
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from sluice import CheckpointConfig, FixedDelayRestart, KeyedProcessFunction, Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.sinks.files import CompactionPolicy, FileSink, RollingPolicy

from tests.runtimes import spark_in_soak
from tests.sinks.conftest import local_files, read_visible, same_rows

NAME = re.compile(r"part-.+-(\d{6})-\d{3}-c?\d+-[0-9a-f]{12}\.parquet$")


class Identity(KeyedProcessFunction):
    def process(self, key: Any, rows: pa.RecordBatch, ctx: Any) -> pa.RecordBatch:
        return rows


@spark_in_soak
@pytest.mark.parametrize("max_checkpoints", [1, 3])
def test_one_file_per_bucket_per_compaction_window(tmp_path, max_checkpoints, runtime: str) -> None:
    src = GeneratorSource(num_splits=2, records_per_split=1500, batch_size=25, rows_per_second=500)  # ~3 s
    p = Pipeline(
        f"stream-{max_checkpoints}",
        parallelism=2,
        restart=FixedDelayRestart(attempts=1, delay=0),
        checkpoint=CheckpointConfig(interval=1.0, storage=str(tmp_path / "chk")),
    )
    s = p.source(src).map_batches(lambda b: b.append_column("bucket", pc.bit_wise_and(b.column("key"), 3)))
    root = str(tmp_path / "out")
    s.key_by("bucket").process(Identity()).sink(
        FileSink(
            root,
            bucket_by=["bucket"],
            time_bucket="dt=%Y-%m-%d",
            time_column="ts",
            rolling=RollingPolicy(max_size=2048),  # many small files between checkpoints
            compaction=CompactionPolicy(target_size=64 << 20, max_checkpoints=max_checkpoints),
        )
    )
    result = p.run(runtime=runtime, restore="none")
    same_rows(read_visible(root), src.expected())
    visible = [f for f in local_files(root) if not os.path.basename(f).startswith(".")]
    assert result.metrics["files_staged"] > 3 * len(visible)  # small files were merged
    per_window: collections.Counter[tuple[str, int]] = collections.Counter()
    for f in visible:
        m = NAME.search(f)
        assert m, f
        per_window[(os.path.dirname(f), (int(m.group(1)) - 1) // max_checkpoints)] += 1
    assert max(per_window.values()) == 1, per_window
    if max_checkpoints > 1:  # held files were released by later checkpoints and merged there
        per_bucket = collections.Counter(os.path.dirname(f) for f in visible)
        assert max(per_bucket.values()) <= result.last_checkpoint // max_checkpoints + 1
