"""Built-in Kafka -> Delta and Kafka -> Iceberg jobs write checkpoints that hold no pickle (issue 22): the
staged data files (schemas, partition values, Delta stats JSON, Iceberg metrics with bytes bounds) are
JSON in signed files, and come back equal: the restored table holds every record once."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from sluice import CheckpointConfig, FixedDelayRestart, Pipeline
from sluice.connectors.kafka import KafkaSource
from sluice.testing.faults import FaultInjector

from tests.checkpoint_scan import assert_no_pickle
from tests.connectors.kafka.helpers import produce_json
from tests.kafka_broker import TansuBroker
from tests.sinks.tables.helpers import KINDS, Target, ids

SCHEMA = pa.schema([("id", pa.int64()), ("p", pa.int64()), ("ts", pa.int64())])
KEY = "tables-format-test-key-0123456789"


def with_time(batch: pa.RecordBatch) -> pa.RecordBatch:
    time.sleep(0.01)  # checkpoints interleave with the (otherwise instant) bounded reads
    return batch.append_column("t", pc.cast(pc.multiply(batch.column("ts"), 1000), pa.timestamp("us")))


@pytest.mark.tansu("what a table sink's checkpoint holds: plain records produced before the job, read to explicit stops from the fetched end (high_watermark.py); no transactions, timestamp lookups, out-of-range positions or new partitions")
@pytest.mark.kafka
@pytest.mark.parametrize("kind", KINDS)
def test_kafka_to_table_checkpoints_hold_no_pickle(
    kind: str, broker: TansuBroker, topic: Callable[..., str], tmp_path: Path
) -> None:
    target = Target(kind, str(tmp_path / "lake"), {}, str(tmp_path))
    t = topic(2)
    produced = produce_json(broker, t, {0: range(0, 600), 1: range(600, 1000)})
    stops = {(t, p): off for p, off in broker.end_offsets(t).items()}
    p = Pipeline(
        f"format-{kind}",
        parallelism=2,
        checkpoint=CheckpointConfig(interval=0.1, storage=str(tmp_path / "chk"), num_retained=1000, key=KEY),
        restart=FixedDelayRestart(attempts=3, delay=0.0),
    )
    partition_by = ["p"] if kind == "delta" else ["p", "day(t)"]
    src = KafkaSource(broker.bootstrap, t, format="json", schema=SCHEMA, batch_size=50, stopping_offsets=stops)
    p.source(src).map_batches(with_time).sink(target.sink(partition_by=partition_by))
    faults = FaultInjector(point="snapshot_to_ack", after=2)
    result = p.run(runtime="local", restore="none", faults=faults)
    assert result.status == "finished" and faults.fired
    assert ids(target.read()) == sorted(produced)
    seen = assert_no_pickle(tmp_path / "chk", KEY.encode())
    assert seen["metadata files"] >= 2 and seen["json values"], seen
