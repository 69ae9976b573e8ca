"""The job ``sluice demo`` runs: Kafka (JSON orders) -> Parquet files, exactly once.

``sluice demo`` starts it with ``sluice run`` (so it shows the live progress view and serves the control
endpoint and dashboard), kills it, and starts it again; the settings come from the environment:

  DEMO_BOOTSTRAP    the broker, host:port
  DEMO_TOPIC        the orders topic
  DEMO_STOPS        where the bounded read ends, ``partition:offset`` pairs joined by commas (the offsets the
                    demo's producer was given: tansu's high watermark under-reports the last batch, so
                    ``stopping_offsets="latest"`` would miss tail records on it, see docs/kafka.md)
  DEMO_OUT          the output folder: ``orders/`` (the Parquet table, by status), ``dead-letters/`` (the
                    malformed records, with topic, partition and offset), ``checkpoints/``
"""

import os

import pyarrow as pa
from sluice import CheckpointConfig, FixedDelayRestart, Pipeline
from sluice.connectors.kafka import KafkaSource
from sluice.sinks.files import FileSink

SCHEMA = pa.schema(
    [("order_id", pa.int64()), ("customer", pa.string()), ("status", pa.string()), ("amount", pa.float64())]
)


def build_pipeline() -> Pipeline:
    """The job, from the DEMO_* environment variables (``sluice run`` calls this)."""
    topic, out = os.environ["DEMO_TOPIC"], os.environ["DEMO_OUT"]
    stops = {
        (topic, int(p)): int(o) for p, o in (pair.split(":") for pair in os.environ["DEMO_STOPS"].split(","))
    }
    pipeline = Pipeline(
        "sluice-demo",
        parallelism=2,
        checkpoint=CheckpointConfig(interval=1.0, storage=f"{out}/checkpoints"),
        restart=FixedDelayRestart(attempts=3, delay=1.0),
    )
    orders = pipeline.source(
        KafkaSource(
            os.environ["DEMO_BOOTSTRAP"],
            [topic],
            format="json",
            schema=SCHEMA,
            starting_offsets="earliest",
            stopping_offsets=stops,
            on_bad_record="dead_letter",
            batch_size=2_000,
        ),
        name="orders",
    )
    orders.side_output("dead_letters").sink(
        FileSink(f"{out}/dead-letters", format="json"), name="dead-letters"
    )
    orders.sink(FileSink(f"{out}/orders", format="parquet", bucket_by=["status"]), name="parquet")
    return pipeline
