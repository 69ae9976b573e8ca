"""The file sink never overwrites, skips or duplicates what another run of its job committed.

Its visible file names are its lineage record (``part-<job>-<checkpoint>-...``): a run whose checkpoint
storage was wiped, or that restores an older checkpoint than the newest visible file names, is refused
before it writes anything; with ``allow_reprocessing`` it runs, and the re-read range comes twice under new
names (a random token per writer makes every name unique per run). Local disk and moto's S3 server.
"""

from __future__ import annotations

import collections
import re
import shutil
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from sluice import CheckpointConfig, NoRestart, Pipeline, RestoreError
from sluice.checkpoint.storage_loader import checkpoint_storage
from sluice.connectors.generator import GeneratorSource
from sluice.sinks.files import FileSink

from tests import listing
from tests.sinks.conftest import Ctx, MotoS3, read_visible


def with_bucket(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch.append_column("b", pc.bit_wise_and(batch.column("key"), 1))


class Output:
    """A file sink's root on local disk or S3: the sink, what readers see, every file with its version."""

    def __init__(self, tmp: Path, s3: MotoS3 | None = None) -> None:
        self.s3 = s3
        self.bucket = s3.new_bucket() if s3 is not None else ""
        self.root = f"s3://{self.bucket}/out" if s3 is not None else str(tmp / "out")

    def sink(self) -> FileSink:
        opts = self.s3.options() if self.s3 is not None else None
        return FileSink(self.root, bucket_by=["b"], compaction=True, storage_options=opts, multipart_threshold=2000)

    def read(self) -> pa.Table:
        if self.s3 is None:
            return read_visible(self.root)
        return read_visible(f"{self.bucket}/out", filesystem=self.s3.arrow_fs())

    def files(self) -> dict[str, Any]:
        if self.s3 is None:
            # listed while the job runs: a pending file renamed in between is left out (tests/listing.py)
            return {rel: (st.st_size, st.st_mtime_ns) for rel, st in listing.files(self.root).items()}
        pages = self.s3.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix="out/")
        return {o["Key"]: (o["Size"], o["ETag"], o["LastModified"]) for p in pages for o in p.get("Contents", [])}


def pipeline(out: Output, tmp: Path, records: int = 400, rate: float | None = None) -> tuple[GeneratorSource, Pipeline]:
    src = GeneratorSource(num_splits=2, records_per_split=records, batch_size=50, rows_per_second=rate)
    p = Pipeline(
        "lineage",
        parallelism=2,
        checkpoint=CheckpointConfig(interval=0.1, storage=str(tmp / "chk"), num_retained=1000),
        restart=NoRestart(),
    )
    p.source(src).map_batches(with_bucket).sink(out.sink())
    return src, p


def counts(table: pa.Table) -> collections.Counter[int]:
    return collections.Counter(table.column("id").to_pylist())


def wiped_storage_is_refused_then_allowed(out: Output, tmp: Path) -> None:
    src, p = pipeline(out, tmp)
    p.run(runtime="local", restore="none")
    expected = counts(src.expected())
    assert counts(out.read()) == expected
    shutil.rmtree(tmp / "chk")
    before = out.files()

    with pytest.raises(RestoreError) as err:
        pipeline(out, tmp)[1].run(runtime="local")
    text = str(err.value)
    assert "\n" not in text and "already holds checkpoint" in text and "allow_reprocessing" in text, text
    assert out.files() == before, "the refused run wrote or changed files"
    assert counts(out.read()) == expected

    pipeline(out, tmp)[1].run(runtime="local", allow_reprocessing=True)
    assert counts(out.read()) == collections.Counter({i: 2 for i in expected}), "every row once more"
    after = out.files()
    assert {f: after.get(f) for f in before} == before, "files of the first run were overwritten or deleted"


def test_wiped_checkpoint_storage_is_refused_before_any_write(tmp_path: Path) -> None:
    wiped_storage_is_refused_then_allowed(Output(tmp_path), tmp_path)


def test_wiped_checkpoint_storage_on_s3_is_refused_before_any_write(moto_s3: MotoS3, tmp_path: Path) -> None:
    wiped_storage_is_refused_then_allowed(Output(tmp_path, moto_s3), tmp_path)


def test_restoring_an_older_checkpoint_than_the_output_holds_is_refused(tmp_path: Path) -> None:
    out = Output(tmp_path)
    src, p = pipeline(out, tmp_path, records=1000, rate=400)
    client = p.start(runtime="local", restore="none", control_endpoint=None)
    deadline = time.monotonic() + 120

    def newest() -> int:  # the newest checkpoint a visible file names
        names = [re.match(r"part-lineage-(\d{6})-", f.rsplit("/", 1)[-1]) for f in out.files()]
        return max((int(m.group(1)) for m in names if m), default=0)

    while newest() < 2 and client.running and time.monotonic() < deadline:
        time.sleep(0.02)  # until files of a checkpoint after the first are visible
    client.wait()
    expected = counts(src.expected())
    assert counts(out.read()) == expected
    oldest_id, oldest, _ = checkpoint_storage(str(tmp_path / "chk"), "lineage").completed()[0]
    assert newest() > oldest_id, "no visible file is newer than the oldest checkpoint"
    before = out.files()

    with pytest.raises(RestoreError, match="allow_reprocessing"):
        pipeline(out, tmp_path, records=1000)[1].run(runtime="local", restore=oldest)
    assert out.files() == before and counts(out.read()) == expected

    pipeline(out, tmp_path, records=1000)[1].run(runtime="local", restore=oldest, allow_reprocessing=True)
    got = counts(out.read())
    assert set(got) == set(expected) and sum(got.values()) > len(expected), "nothing was re-read"
    for split in (0, 1):  # once up to the restored checkpoint's position, twice after it: the re-read range
        times = [got[i] for i in range(split * 1000, split * 1000 + 1000)]
        assert times == sorted(times) and set(times) <= {1, 2}, f"split {split}: {collections.Counter(times)}"


def test_file_names_are_unique_per_run(tmp_path: Path) -> None:
    """Two writers of the same job, checkpoint, subtask and attempt (two runs) never pick the same name."""
    sink = FileSink(str(tmp_path / "out"), bucket_by=["b"])
    names = []
    for _ in range(2):
        w = sink.create_writer(Ctx(job_id="job", subtask=0, attempt=0), [])
        w.write(with_bucket(GeneratorSource(num_splits=1, records_per_split=10).expected().to_batches()[0]))
        names.append({c.final for c in w.prepare_commit(1)})
        w.close()
    assert names[0] and not names[0] & names[1], names


JOB = """
from sluice import CheckpointConfig, NoRestart, Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.sinks.files import FileSink

pipeline = Pipeline("cli-lineage", checkpoint=CheckpointConfig(interval=0.1, storage={chk!r}), restart=NoRestart())
pipeline.source(GeneratorSource(num_splits=1, records_per_split=200, batch_size=50)).sink(FileSink({out!r}))
"""


def test_sluice_run_refuses_in_one_line_and_runs_with_allow_reprocessing(tmp_path: Path) -> None:
    from click.testing import CliRunner
    from sluice.cli import main

    chk, out = tmp_path / "chk", tmp_path / "out"
    job = tmp_path / "job.py"
    job.write_text(JOB.format(chk=str(chk), out=str(out)))
    args = ["run", str(job), "--runtime", "local", "--control-endpoint", "none", "--no-progress"]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    shutil.rmtree(chk)
    refused = CliRunner().invoke(main, args)
    lines = refused.output.strip().splitlines()
    assert refused.exit_code == 1 and len(lines) == 1 and lines[0].startswith("Error: "), refused.output
    assert "already holds checkpoint" in lines[0] and "--allow-reprocessing" in lines[0], lines[0]
    again = CliRunner().invoke(main, [*args, "--allow-reprocessing"])
    assert again.exit_code == 0, again.output
    assert counts(read_visible(str(out))) == collections.Counter({i: 2 for i in range(200)})
