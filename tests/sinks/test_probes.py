"""Each sink's output is probed once at job start: what cannot be written fails the job at once, in one line
naming the sink (its operator) and the option to fix, before any attempt runs (no restart is spent).

Before, an unwritable FileSink path spent all the restarts (16-20 s) and ended in a bare
``FileNotFoundError`` naming neither sink nor option. Errors met later, while the job runs, that a restart
cannot cure (permission denied, S3's AccessDenied / NoSuchBucket / wrong credentials) are not recoverable.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sluice import FixedDelayRestart, Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.errors import ConfigError, StorageError, is_recoverable
from sluice.io.s3 import s3_call
from sluice.sink import Sink
from sluice.sinks.delta import DeltaSink
from sluice.sinks.files import FileSink
from sluice.sinks.iceberg import IcebergSink
from sluice.sinks.kafka import KafkaSink
from sluice.sinks.postgres import PostgresSink

from tests.kafka_broker import TansuBroker
from tests.postgres_server import PostgresServer
from tests.sinks.conftest import MotoS3


def refused(sink: Sink[Any], tmp: Path) -> str:
    """The one line a job writing to ``sink`` is refused with at start (it must not start an attempt)."""
    p = Pipeline("probed", checkpoint={"storage": str(tmp / "chk")}, restart=FixedDelayRestart(attempts=5, delay=2))
    p.source(GeneratorSource(num_splits=1, records_per_split=10)).sink(sink)
    with pytest.raises(ConfigError) as err:
        p.start(runtime="local", restore="none", control_endpoint=None)  # raises before any attempt runs
    text = str(err.value)
    assert "\n" not in text and not is_recoverable(err.value), text
    return text


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    """A regular file: a folder below it cannot be made (whoever runs the tests, root included)."""
    f = tmp_path / "a-file"
    f.write_text("x")
    return f


def test_file_and_table_sinks_on_a_path_that_cannot_be_written(tmp_path: Path, a_file: Path) -> None:
    text = refused(FileSink(str(a_file / "out"), format="json"), tmp_path)
    assert text.startswith(f"sink 'file-sink': FileSink path '{a_file}/out' is not writable: "), text
    assert "(fix the path or its permissions)" in text
    text = refused(DeltaSink(str(a_file / "table")), tmp_path)
    assert text.startswith(f"sink 'delta-sink': DeltaSink path '{a_file}/table' is not writable: "), text
    with pytest.raises(ConfigError, match=r"IcebergSink: warehouse: the folder .* cannot be made: NotADirectoryError"):
        IcebergSink("db.events", warehouse=str(a_file / "warehouse"))  # the embedded catalog's folder: at once
    rest = {"type": "rest", "uri": "http://127.0.0.1:1"}
    text = refused(IcebergSink("db.events", catalog_properties=rest), tmp_path)
    assert text.startswith("sink 'iceberg-sink': IcebergSink 'db.events': catalog 'sluice' cannot be reached: "), text
    assert "(fix catalog_properties, or warehouse for the embedded catalog)" in text, text
    # a writable place passes, and the probe leaves nothing behind
    ok = tmp_path / "fine"
    FileSink(str(ok), format="json").probe()
    DeltaSink(str(tmp_path / "table")).probe()
    IcebergSink("db.events", warehouse=str(tmp_path / "warehouse")).probe()
    assert list(ok.iterdir()) == [] and list((tmp_path / "table").iterdir()) == []


@pytest.mark.s3
def test_s3_outputs_with_a_missing_bucket(moto_s3: MotoS3, tmp_path: Path) -> None:
    opts = moto_s3.options()
    text = refused(FileSink("s3://no-such-bucket-probe/out", storage_options=opts), tmp_path)
    assert text.startswith("sink 'file-sink': FileSink path 's3://no-such-bucket-probe/out' is not writable: "), text
    assert "NoSuchBucket" in text and "storage_options" in text, text
    text = refused(DeltaSink("s3://no-such-bucket-probe/t", storage_options=opts), tmp_path)
    assert text.startswith("sink 'delta-sink': DeltaSink path 's3://no-such-bucket-probe/t' is not writable"), text
    bucket = moto_s3.new_bucket()
    FileSink(f"s3://{bucket}/out", storage_options=opts).probe()
    assert moto_s3.client().list_objects_v2(Bucket=bucket).get("KeyCount") == 0


@pytest.mark.kafka
def test_kafka_sink_unknown_topic_and_unreachable_broker(broker: TansuBroker, tmp_path: Path) -> None:
    text = refused(KafkaSink(broker.bootstrap, "no-such-topic-probe"), tmp_path)
    assert text.startswith("sink 'kafka-sink': KafkaSink: topic 'no-such-topic-probe' does not exist on "), text
    text = refused(KafkaSink("127.0.0.1:1", "t", transaction_timeout_s=2), tmp_path)
    assert text.startswith("sink 'kafka-sink': KafkaSink: cannot reach 127.0.0.1:1 (bootstrap_servers"), text


def test_postgres_sink_missing_table_without_create_table(postgres: PostgresServer, tmp_path: Path) -> None:
    db = postgres.new_database()
    text = refused(PostgresSink(db, "missing", create_table=False), tmp_path)
    assert text.startswith("sink 'postgres-sink': PostgresSink: table 'missing' does not exist in sluice@"), text
    assert "create_table is False" in text
    PostgresSink(db, "created_later").probe()  # missing, but the sink may create it


def test_an_unwritable_output_under_sluice_run_is_one_line_and_no_attempt(tmp_path: Path, a_file: Path) -> None:
    (tmp_path / "job.py").write_text(
        "from sluice import Pipeline\nfrom sluice.connectors.generator import GeneratorSource\n"
        "from sluice.sinks.files import FileSink\n\n"
        'pipeline = Pipeline("unwritable", checkpoint={"storage": "./checkpoints"})\n'
        f'pipeline.source(GeneratorSource(num_splits=1)).sink(FileSink("{a_file}/out", format="json"))\n'
    )
    cmd = [sys.executable, "-m", "sluice.cli", "run", "job.py", "--runtime", "local"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [r.stderr.strip()], r.stderr
    assert r.stderr.startswith(f"Error: sink 'file-sink': FileSink path '{a_file}/out' is not writable: "), r.stderr
    assert "attempt" not in r.stderr


def test_errors_a_restart_cannot_cure_are_not_recoverable() -> None:
    from botocore.exceptions import ClientError

    def denied() -> None:
        raise ClientError({"Error": {"Code": "AccessDenied", "Message": "no"}}, "PutObject")

    def throttled() -> None:
        raise ClientError({"Error": {"Code": "SlowDown", "Message": "later"}}, "PutObject")

    with pytest.raises(StorageError) as err:
        s3_call("PutObject", "b", denied)
    assert not is_recoverable(err.value) and err.value.code == "AccessDenied"
    with pytest.raises(StorageError) as err:
        s3_call("PutObject", "b", throttled, attempts=1)
    assert is_recoverable(err.value)
    try:
        try:
            raise PermissionError(13, "Permission denied", "/data/out")
        except PermissionError as exc:
            raise RuntimeError("the writer failed") from exc
    except RuntimeError as wrapped:
        assert not is_recoverable(wrapped)
