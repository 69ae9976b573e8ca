"""Kafka -> Delta and Kafka -> Iceberg: bounded jobs with a crash, on the in-process and the Spark runtime,
on a local folder and on moto's S3 server; the table holds every record exactly once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from sluice import CheckpointConfig, FixedDelayRestart, Pipeline
from sluice.connectors.kafka import KafkaSource
from sluice.testing.faults import FaultInjector

from tests.connectors.kafka.helpers import produce_json
from tests.kafka_broker import TansuBroker
from tests.sinks.conftest import MotoS3
from tests.sinks.tables.conftest import s3_target_of
from tests.sinks.tables.helpers import Target, completed, ids

SCHEMA = pa.schema([("id", pa.int64()), ("p", pa.int64()), ("ts", pa.int64())])
CASES = [
    ("delta", "local", "local"),
    ("iceberg", "local", "local"),
    ("delta", "local", "s3"),
    ("iceberg", "local", "s3"),
    ("delta", "spark", "s3"),
    ("iceberg", "spark", "local"),
]


def with_time(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch.append_column("t", pc.cast(pc.multiply(batch.column("ts"), 1000), pa.timestamp("us")))


@pytest.mark.tansu("table sinks under a crash: plain records produced before the job, read to explicit stops from the fetched end (high_watermark.py); no transactions, timestamp lookups, out-of-range positions or new partitions")
@pytest.mark.kafka
@pytest.mark.faults
@pytest.mark.parametrize(("kind", "runtime", "store"), CASES, ids=["-".join(c) for c in CASES])
def test_kafka_to_table_exactly_once_with_a_crash(
    kind: str, runtime: str, store: str, broker: TansuBroker, topic: Callable[..., str], tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    if runtime == "spark":
        request.getfixturevalue("spark")
    target = (
        s3_target_of(kind, request.getfixturevalue("moto_s3"), str(tmp_path))
        if store == "s3"
        else Target(kind, str(tmp_path / "lake"), {}, str(tmp_path))
    )
    t = topic(2)
    produced = produce_json(broker, t, {0: range(0, 900), 1: range(900, 1500)})
    stops = {(t, p): off for p, off in broker.end_offsets(t).items()}
    p = Pipeline(
        f"kafka-{kind}",
        parallelism=2,
        checkpoint=CheckpointConfig(interval=0.1, storage=str(tmp_path / "chk")),
        restart=FixedDelayRestart(attempts=3, delay=0.0),
    )
    partition_by = ["p"] if kind == "delta" else ["p", "day(t)"]
    src = KafkaSource(broker.bootstrap, t, format="json", schema=SCHEMA, batch_size=50, stopping_offsets=stops)
    p.source(src).map_batches(_slow).map_batches(with_time).sink(target.sink(partition_by=partition_by))
    faults = FaultInjector(point="snapshot_to_ack", after=1)
    result = p.run(runtime=runtime, restore="none", faults=faults)
    assert faults.fired, "the crash did not happen"
    assert result.attempts >= 2
    assert ids(target.read()) == sorted(produced)
    assert ids(target.read_independently()) == sorted(produced)
    assert target.versions() <= completed(result)


def _slow(batch: Any) -> Any:
    import time

    time.sleep(0.01)  # checkpoints interleave with the (otherwise instant) bounded reads
    return batch


@pytest.mark.s3
def test_delta_on_s3_commits_with_conditional_puts_one_racer_wins(moto_s3: MotoS3, tmp_path: Path) -> None:
    """Two clients commit the same next version of a table on moto's S3: the conditional put (If-None-Match)
    lets exactly one win; the loser gets an error instead of overwriting the winner's log entry."""
    import threading

    from deltalake import DeltaTable, write_deltalake
    from deltalake.transaction import CommitProperties

    target = s3_target_of("delta", moto_s3, str(tmp_path))
    opts = target.sink().options.delta_storage_options()  # type: ignore[attr-defined]
    assert opts["conditional_put"] == "etag"
    path = f"{target.root}/table"
    write_deltalake(path, pa.table({"id": [0]}), storage_options=opts)
    a, b = DeltaTable(path, storage_options=opts), DeltaTable(path, storage_options=opts)
    outcomes: list[str] = []
    start = threading.Barrier(2)

    def commit(table: Any, i: int) -> None:
        start.wait()
        try:
            write_deltalake(table, pa.table({"id": [i]}), mode="append", commit_properties=CommitProperties(max_commit_retries=0))
            outcomes.append("won")
        except Exception as exc:
            outcomes.append(type(exc).__name__)

    threads = [threading.Thread(target=commit, args=(tbl, i)) for i, tbl in ((1, a), (2, b))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sorted(outcomes) == ["CommitFailedError", "won"], outcomes
    final = DeltaTable(path, storage_options=opts)
    assert final.version() == 1 and final.to_pyarrow_table().num_rows == 2
