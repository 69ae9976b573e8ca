"""Template job: Kafka topic -> Parquet files in MinIO (S3), exactly once, on Spark.

Run by docker/compose.yaml's ``sluice-job`` service (SIGTERM stops it with a savepoint)::

    sluice run /opt/sluice/docker/jobs/kafka_to_minio.py --master spark://spark-master:7077 --control-endpoint 0.0.0.0:8765

The driver runs the checkpoint coordinator; one barrier-mode stage runs ``SLUICE_PARALLELISM`` slots on the
Spark workers, so the cluster must offer that many task slots at once (and dynamic allocation stays off).
Every ``interval`` seconds a checkpoint completes: the Kafka offsets and the sinks' staged files are written
under ``SLUICE_CHECKPOINTS`` and the files staged for it become visible under ``SLUICE_OUTPUT``.

S3 endpoint and credentials come from boto3's environment variables (``AWS_ENDPOINT_URL_S3``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``), set on the driver and on the workers.

Environment (defaults match docker/compose.yaml):
    KAFKA_BOOTSTRAP_SERVERS  kafka:9092
    SLUICE_TOPIC             events
    SLUICE_PARALLELISM       4
    SLUICE_OUTPUT            s3://sluice/output
    SLUICE_CHECKPOINTS       s3://sluice/checkpoints
    SLUICE_STOP_AT           empty = run until cancelled; "latest" = stop at the end offsets seen at start
"""

from __future__ import annotations

import os

import pyarrow as pa
from sluice import CheckpointConfig, FixedDelayRestart, Pipeline
from sluice.connectors.kafka import KafkaSource
from sluice.sinks.files import FileSink

BOOTSTRAP = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "kafka:9092")
TOPIC = os.environ.get("SLUICE_TOPIC", "events")
PARALLELISM = int(os.environ.get("SLUICE_PARALLELISM", "4"))
OUTPUT = os.environ.get("SLUICE_OUTPUT", "s3://sluice/output").rstrip("/")
CHECKPOINTS = os.environ.get("SLUICE_CHECKPOINTS", "s3://sluice/checkpoints")
STOP_AT = os.environ.get("SLUICE_STOP_AT") or None

#: the events docker/jobs/produce_events.py writes (unknown fields are ignored; a value that does not
#: parse goes to the dead-letter files instead of failing the job)
EVENT_SCHEMA = pa.schema(
    [
        ("event_id", pa.int64()),
        ("user_id", pa.string()),
        ("kind", pa.string()),
        ("amount", pa.float64()),
        ("ts", pa.int64()),  # event time, epoch milliseconds
    ]
)

pipeline = Pipeline(
    "kafka-to-minio",  # also the job id: checkpoints go to <SLUICE_CHECKPOINTS>/kafka-to-minio/chk-<n>/
    parallelism=PARALLELISM,
    checkpoint=CheckpointConfig(storage=CHECKPOINTS, interval=5.0),
    restart=FixedDelayRestart(attempts=5, delay=5.0),
)

events = pipeline.source(
    KafkaSource(
        bootstrap_servers=BOOTSTRAP,
        topics=[TOPIC],
        format="json",
        schema=EVENT_SCHEMA,
        starting_offsets="earliest",
        stopping_offsets=STOP_AT,
        on_bad_record="dead_letter",
    ),
    name="kafka-events",
)

events.side_output("dead_letters").sink(
    FileSink(f"{OUTPUT}/dead-letters", format="json"),
    name="dead-letters",
)
events.sink(
    FileSink(
        f"{OUTPUT}/events",
        format="parquet",
        compression="zstd",
        bucket_by=["kind"],  # kind=click/...
        time_bucket="dt=%Y-%m-%d/hour=%H",  # ... then event-time folders (UTC)
        time_column="ts",
    ),
    name="events-parquet",
)

if __name__ == "__main__":  # spark-submit kafka_to_minio.py (compose runs it with `sluice run`)
    from sluice import SluiceError

    try:
        result = pipeline.run(runtime="spark")
    except SluiceError as exc:
        raise SystemExit(f"kafka-to-minio: {exc}") from None
    print(f"kafka-to-minio: {result.status} after {result.attempts} attempt(s), last checkpoint {result.last_checkpoint}")
