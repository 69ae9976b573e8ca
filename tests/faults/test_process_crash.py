"""Whole-process crashes: ``sluice run job.py`` SIGKILLed at random moments, restarted, output compared.

A Kafka -> Parquet job (FileSink on local disk or on moto's S3 server) runs as a subprocess of the
``sluice`` command. The test kills it with SIGKILL at random moments, several times, restarts it each time
(``--restore latest`` is the default, so each run resumes the previous one's latest checkpoint), lets the
last run finish, and compares what a reader sees with what was produced: every record exactly once, no
half-visible file. A kill counts only if it hit a running job (the process had not exited on its own).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests import listing
from tests.apache_kafka import ApacheKafkaBroker
from tests.connectors.kafka.helpers import produce_json
from tests.faults.shapes import record
from tests.kafka_broker import TansuBroker
from tests.kafka_test_broker import KafkaTestBroker
from tests.sinks.conftest import FINAL, MotoS3, read_visible, s3_keys

JOB = textwrap.dedent(
    '''
    """Kafka -> Parquet, configured from the environment (written by tests/faults/test_process_crash.py)."""
    import json
    import os
    import time

    import pyarrow as pa
    from sluice import CheckpointConfig, FixedDelayRestart, Pipeline
    from sluice.connectors.kafka import KafkaSource
    from sluice.sinks.files import FileSink

    env = os.environ
    stops = {(t, int(p)): o for t, p, o in json.loads(env["JOB_STOPS"])}
    s3 = json.loads(env.get("JOB_S3") or "null")


    def slow(batch: pa.RecordBatch) -> pa.RecordBatch:
        time.sleep(0.04)  # a job that takes several seconds, so kills land while it runs
        return batch


    pipeline = Pipeline(
        "process-crash",
        parallelism=int(env["JOB_PARALLELISM"]),
        checkpoint=CheckpointConfig(interval=float(env["JOB_INTERVAL"]), storage=env["JOB_CHECKPOINTS"]),
        restart=FixedDelayRestart(attempts=2, delay=0.0),
    )
    (
        pipeline.source(
            KafkaSource(
                env["JOB_BOOTSTRAP"],
                env["JOB_TOPIC"],
                format="json",
                schema=pa.schema([("id", pa.int64()), ("p", pa.int64()), ("ts", pa.int64())]),
                batch_size=100,
                stopping_offsets=stops,
            )
        )
        .map_batches(slow)
        .sink(FileSink(env["JOB_OUT"], format="parquet", bucket_by=["p"], storage_options=s3))
    )
    '''
)


def _completed(checkpoints: Path) -> set[str]:
    return {m.parent.name for m in checkpoints.glob("*/chk-*/_metadata")}


def run_with_kills(
    job: Path, env: dict[str, str], rng: random.Random, kills: int, cwd: Path
) -> tuple[int, list[float]]:
    """Start the job ``kills`` times and SIGKILL each run at a random moment after it completed a checkpoint
    of its own (so the kill lands while it processes); then run it to the end."""
    fired = 0
    moments = []
    checkpoints = Path(env["JOB_CHECKPOINTS"])
    cmd = [sys.executable, "-m", "sluice.cli", "run", str(job), "--runtime", "local"]
    for _ in range(kills):
        before = _completed(checkpoints)
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        started = time.monotonic()
        while proc.poll() is None and not _completed(checkpoints) - before:
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 1.0))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            fired += 1
            moments.append(round(time.monotonic() - started, 2))
        proc.wait(60)
        out = proc.stdout.read().decode() if proc.stdout else ""
        assert proc.returncode in (0, -signal.SIGKILL), out
    last = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert last.returncode == 0, last.stdout + last.stderr
    assert "finished" in last.stdout, last.stdout
    return fired, moments


def scenario(
    broker: KafkaTestBroker, topic: str, tmp_path: Path, seed: int, kills: int, s3: MotoS3 | None
) -> None:
    rng = random.Random(seed)
    parts = rng.choice([1, 2, 3])
    ids = produce_json(broker, topic, {p: range(p * 100_000, p * 100_000 + rng.choice([4000, 7000])) for p in range(parts)})
    stops = [(topic, p, o) for p, o in broker.end_offsets(topic).items()]
    if s3 is not None:
        bucket = s3.new_bucket()
        out, fs, s3_opts = f"s3://{bucket}/orders", s3.arrow_fs(), s3.options()
    else:
        out, fs, s3_opts = str(tmp_path / "out"), None, None
    job = tmp_path / "job.py"
    job.write_text(JOB)
    env = {
        **os.environ,
        "JOB_BOOTSTRAP": broker.bootstrap,
        "JOB_TOPIC": topic,
        "JOB_STOPS": json.dumps(stops),
        "JOB_S3": json.dumps(s3_opts),
        "JOB_OUT": out,
        "JOB_CHECKPOINTS": str(tmp_path / "chk"),
        "JOB_PARALLELISM": str(rng.choice([1, 2])),
        "JOB_INTERVAL": str(rng.choice([0.2, 0.5, 1.0])),
    }
    fired, moments = run_with_kills(job, env, rng, kills, tmp_path)
    table = read_visible(out.removeprefix("s3://"), "parquet", fs)
    got = sorted(table.column("id").to_pylist())
    lost, dup = len(set(ids) - set(got)), len(got) - len(set(got))
    record("process-kill", seed, "kafka-parquet", "aligned", fired > 0, fired, got, sorted(ids))
    assert fired > 0, "no kill hit a running job"
    assert not lost and not dup and got == sorted(ids), (
        f"kills at {moments} s: {lost} lost, {dup} duplicated of {len(ids)}"
    )
    if s3 is not None:
        bucket = out[5:].split("/")[0]
        keys = s3_keys(s3, bucket)
        assert all(FINAL.match(k.rsplit("/", 1)[-1]) for k in keys), f"hidden objects left: {keys}"
        uploads = s3.client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])
        assert not uploads, f"multipart uploads left open: {uploads}"
    else:
        left = [f for f in listing.file_paths(tmp_path / "out") if not FINAL.match(f.name)]
        assert not left, f"hidden files left: {left}"


@pytest.mark.faults
@pytest.mark.tansu("whole-process SIGKILLs of sluice run: plain records produced before the job, read to explicit stops from the fetched end (high_watermark.py); no transactions, timestamp lookups, out-of-range positions or new partitions")
@pytest.mark.kafka
@pytest.mark.usefixtures("kafka_reader")  # on both readers
@pytest.mark.parametrize("seed", [1, 2])
def test_sigkill_local_files(broker: TansuBroker, topic: Any, tmp_path: Path, seed: int) -> None:
    scenario(broker, topic(3), tmp_path, seed, kills=3, s3=None)


@pytest.mark.faults
@pytest.mark.tansu("whole-process SIGKILLs of sluice run: plain records produced before the job, read to explicit stops from the fetched end (high_watermark.py); no transactions, timestamp lookups, out-of-range positions or new partitions")
@pytest.mark.kafka
@pytest.mark.usefixtures("kafka_reader")  # on both readers
def test_sigkill_local_files_on_apache_kafka(
    apache_kafka: ApacheKafkaBroker, kafka_topic: Callable[..., str], tmp_path: Path
) -> None:
    """The same kills with a real Apache Kafka under the source (transactions, offsets as Kafka keeps them)."""
    scenario(apache_kafka, kafka_topic(3), tmp_path, 4, kills=3, s3=None)


@pytest.mark.faults
@pytest.mark.kafka
@pytest.mark.s3
def test_sigkill_s3(broker: TansuBroker, topic: Any, moto_s3: MotoS3, tmp_path: Path) -> None:
    scenario(broker, topic(3), tmp_path, 3, kills=3, s3=moto_s3)


@pytest.mark.soak
@pytest.mark.tansu("whole-process SIGKILLs of sluice run: plain records produced before the job, read to explicit stops from the fetched end (high_watermark.py); no transactions, timestamp lookups, out-of-range positions or new partitions")
@pytest.mark.kafka
@pytest.mark.usefixtures("kafka_reader")  # on both readers
@pytest.mark.parametrize("seed", range(100, 130))
def test_soak_sigkill(broker: TansuBroker, topic: Any, moto_s3: MotoS3, tmp_path: Path, seed: int) -> None:
    scenario(broker, topic(3), tmp_path, seed, kills=6, s3=moto_s3 if seed % 2 else None)

