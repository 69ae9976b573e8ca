"""A built-in Kafka -> files job writes checkpoints that hold no pickle (issue 22): splits, enumerator
state, committables, the file writers' held files and channel state are JSON or Arrow IPC in signed
files. (Before, the task state files and two fields of ``_metadata`` were pickles.)"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from sluice import CheckpointConfig, FixedDelayRestart, Pipeline
from sluice.connectors.kafka import KafkaSource
from sluice.sinks.files import CompactionPolicy, FileSink
from sluice.testing.faults import FaultInjector

from tests.checkpoint_scan import assert_no_pickle
from tests.connectors.kafka.helpers import produce_json
from tests.kafka_broker import TansuBroker

pytestmark = [pytest.mark.kafka, pytest.mark.usefixtures("kafka_reader"), pytest.mark.tansu(
    "what a checkpoint holds: plain records produced before the job, read to explicit stops from the fetched end (high_watermark.py); no transactions, timestamp lookups, out-of-range positions or new partitions"
)]

SCHEMA = pa.schema([("id", pa.int64()), ("p", pa.int64()), ("ts", pa.int64())])
KEY = "kafka-format-test-key-0123456789"


def slow(batch: pa.RecordBatch) -> pa.RecordBatch:
    time.sleep(0.005)  # checkpoints interleave with the (otherwise instant) bounded reads
    return batch


def test_kafka_to_files_checkpoints_hold_no_pickle(
    broker: TansuBroker, topic: Callable[..., str], tmp_path: Path
) -> None:
    t = topic(2)
    produce_json(broker, t, {0: range(0, 1500), 1: range(1500, 3000)})
    stops = {(t, p): off for p, off in broker.end_offsets(t).items()}
    p = Pipeline(
        "kafka-format",
        parallelism=2,
        checkpoint=CheckpointConfig(interval=0.05, storage=str(tmp_path / "chk"), num_retained=1000, unaligned=True, key=KEY),
        restart=FixedDelayRestart(attempts=3, delay=0.0),
    )
    src = KafkaSource(broker.bootstrap, t, format="json", schema=SCHEMA, batch_size=50, stopping_offsets=stops)
    sink = FileSink(str(tmp_path / "out"), format="parquet", compaction=CompactionPolicy(max_checkpoints=3))
    p.source(src).map_batches(slow).rebalance().map_batches(slow).sink(sink)
    faults = FaultInjector(point="snapshot_to_ack", after=4)
    result = p.run(runtime="local", restore="none", faults=faults)
    assert result.status == "finished" and faults.fired
    seen = assert_no_pickle(tmp_path / "chk", KEY.encode())
    assert seen["metadata files"] >= 3 and seen["state files"] and seen["json values"], seen
