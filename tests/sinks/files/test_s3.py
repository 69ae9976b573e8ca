"""S3 against moto's HTTP server: multipart commit, idempotency, recover, errors, checkpoint storage."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pytest
from sluice import CheckpointConfig, FixedDelayRestart, Pipeline
from sluice.checkpoint.s3 import S3CheckpointStorage
from sluice.checkpoint.stats_log import CheckpointStatsLog
from sluice.checkpoint.storage_loader import checkpoint_storage
from sluice.connectors.generator import GeneratorSource
from sluice.errors import CommitError
from sluice.sinks.files import FileSink, StorageError

from tests.sinks.conftest import Ctx, MotoS3, read_visible, s3_keys, same_rows
from tests.sinks.files.test_lifecycle import expected, rows

pytestmark = pytest.mark.s3


def sink_on(s3: MotoS3, bucket: str, **kw) -> FileSink:
    return FileSink(f"s3://{bucket}/tbl", bucket_by=["b"], storage_options=s3.options(), **kw)


def test_large_files_are_multipart_uploads_completed_at_commit(moto_s3) -> None:
    bucket = moto_s3.new_bucket()
    sink = sink_on(moto_s3, bucket, multipart_threshold=1)
    ctx = Ctx()
    w, c = sink.create_writer(ctx, []), sink.create_committer(ctx)
    w.write(rows(0, 200))
    comms = w.prepare_commit(1)
    assert all(x.upload_id and x.parts and x.staged == x.final for x in comms)
    assert s3_keys(moto_s3, bucket) == []  # parts uploaded, nothing visible
    assert len(moto_s3.client().list_multipart_uploads(Bucket=bucket)["Uploads"]) == 2
    c.commit(comms)
    c.commit(comms)  # already completed and the object exists: a no-op
    same_rows(read_visible(f"{bucket}/tbl", filesystem=moto_s3.arrow_fs()), expected(0, 200))
    assert "Uploads" not in moto_s3.client().list_multipart_uploads(Bucket=bucket)


def test_small_files_are_hidden_objects_copied_at_commit(moto_s3) -> None:
    bucket = moto_s3.new_bucket()
    sink = sink_on(moto_s3, bucket, format="csv")
    ctx = Ctx()
    w, c = sink.create_writer(ctx, []), sink.create_committer(ctx)
    w.write(rows(0, 100))
    comms = w.prepare_commit(1)
    assert all(os.path.basename(k).startswith(".") for k in s3_keys(moto_s3, bucket))
    c.commit(comms)
    c.commit(comms)
    keys = s3_keys(moto_s3, bucket)
    assert len(keys) == 2 and not any(os.path.basename(k).startswith(".") for k in keys)
    same_rows(read_visible(f"{bucket}/tbl", "csv", moto_s3.arrow_fs()), expected(0, 100))


def test_recover_aborts_uploads_and_deletes_objects_of_unfinished_checkpoints(moto_s3) -> None:
    bucket = moto_s3.new_bucket()
    big = sink_on(moto_s3, bucket, multipart_threshold=1)
    w = big.create_writer(Ctx(), [])
    w.write(rows(0, 100))
    kept = w.prepare_commit(1)
    w.write(rows(100, 200))
    w.prepare_commit(2)  # never completes
    small = sink_on(moto_s3, bucket).create_writer(Ctx(attempt=1), [])
    small.write(rows(200, 300))
    small.prepare_commit(3)  # never completes either
    other = sink_on(moto_s3, bucket, multipart_threshold=1).create_writer(Ctx(job_id="job-2"), [])
    other.write(rows(0, 10))
    other.prepare_commit(1)  # another job's upload: untouched
    big.recover("job", kept)
    uploads = moto_s3.client().list_multipart_uploads(Bucket=bucket)["Uploads"]
    assert sorted(u["UploadId"] for u in uploads if "job-2" not in u["Key"]) == sorted(
        x.upload_id for x in kept
    )
    assert sum("job-2" in u["Key"] for u in uploads) == 2
    assert s3_keys(moto_s3, bucket) == []
    big.create_committer(Ctx()).commit(kept)
    same_rows(read_visible(f"{bucket}/tbl", filesystem=moto_s3.arrow_fs()), expected(0, 100))


def test_commit_of_a_lost_upload_fails_clearly(moto_s3) -> None:
    bucket = moto_s3.new_bucket()
    sink = sink_on(moto_s3, bucket, multipart_threshold=1)
    w = sink.create_writer(Ctx(), [])
    w.write(rows(0, 10))
    comms = w.prepare_commit(1)
    sink.recover("job", [])  # e.g. a lifecycle rule aborted it
    # S3 answers NoSuchUpload (-> CommitError "data is lost"); moto's server answers 500 (a KeyError inside
    # moto), which stays a StorageError after the retries. Either way the commit fails, nothing is visible.
    with pytest.raises((CommitError, StorageError), match=r"data is lost|CompleteMultipartUpload"):
        sink.create_committer(Ctx()).commit(comms)
    assert s3_keys(moto_s3, bucket) == []


def test_missing_bucket_error_names_bucket_and_operation(moto_s3) -> None:
    sink = sink_on(moto_s3, "no-such-bucket-here")
    w = sink.create_writer(Ctx(), [])
    w.write(rows(0, 10))
    with pytest.raises(StorageError) as err:
        w.prepare_commit(1)
    assert err.value.bucket == "no-such-bucket-here" and err.value.code == "NoSuchBucket"
    assert "PutObject" in str(err.value) and "no-such-bucket-here" in str(err.value)


def test_checkpoint_storage_primitives_and_conditional_metadata(moto_s3) -> None:
    bucket = moto_s3.new_bucket()
    st = checkpoint_storage(f"s3://{bucket}/chk", "job", **moto_s3.options())
    assert isinstance(st, S3CheckpointStorage)
    st.write_task_state(1, "0-0.state", b"state")
    assert st.completed() == []  # no metadata: not completed
    st.write_metadata(1, {"checkpoint_id": 1, "tasks": {}})
    assert st.completed() == [(1, f"s3://{bucket}/chk/job/chk-1", False)]
    assert st.read_metadata_at(st.latest())["checkpoint_id"] == 1
    with pytest.raises(StorageError, match="PreconditionFailed"):
        st.write_metadata(1, {"checkpoint_id": 1, "tasks": {}})  # a checkpoint completes once
    stats = CheckpointStatsLog(st)
    stats.record({"checkpoint_id": 1})
    stats.record({"checkpoint_id": 2})
    assert [s["checkpoint_id"] for s in st.read_stats()] == [1, 2]
    assert st.jobs() == ["job"]
    with pytest.raises(FileNotFoundError):
        st.read_file(f"s3://{bucket}/chk/job/chk-9/x")
    st.discard(1)
    assert st.completed() == [] and st.list_dirs(st.job_dir()) == ["_stats"]
    lines = st.read_file(f"{st.job_dir()}/_stats/0000000000.jsonl").splitlines()
    assert [json.loads(line)["checkpoint_id"] for line in lines] == [1, 2]


def test_job_with_checkpoints_and_files_on_s3(moto_s3, monkeypatch) -> None:
    # CheckpointConfig has no storage options: boto3 reads the endpoint from the environment
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_s3.endpoint)
    bucket = moto_s3.new_bucket()
    src = GeneratorSource(num_splits=2, records_per_split=400, batch_size=50, rows_per_second=1000)
    p = Pipeline(
        "s3-job",
        parallelism=2,
        restart=FixedDelayRestart(attempts=3, delay=0),
        checkpoint=CheckpointConfig(interval=0.1, storage=f"s3://{bucket}/checkpoints"),
    )
    p.source(src).map_batches(
        lambda b: b.append_column("b", pa.compute.bit_wise_and(b.column("key"), 1))
    ).sink(sink_on(moto_s3, bucket, compaction=True))
    result = p.run(runtime="local", restore="none")
    assert result.status == "finished" and result.last_checkpoint
    assert any(
        k.startswith("checkpoints/s3-job/chk-") and k.endswith("/_metadata") for k in s3_keys(moto_s3, bucket)
    )
    same_rows(read_visible(f"{bucket}/tbl", filesystem=moto_s3.arrow_fs()), src.expected())
