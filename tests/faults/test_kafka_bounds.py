"""Kafka cases of the fault tier: a bounded rerun after an unbounded run, and large records with a schema.

* An unbounded run is cancelled once it committed the input; more records come; the job is run again with
  stopping offsets (restoring the first run's latest checkpoint, the default): it must end by itself, with
  the output equal to the input, into the file sink, Delta and Iceberg. (Issue 21: the restored splits kept
  the first run's unbounded stop, the rerun never ended.) A rerun that still runs after the whole input was
  committed and ten more checkpoints completed is taken as one that never ends.
* JSON records of 600 KB and 1 MB with a schema decode (the default limit is Kafka's 1 MiB); one of 1.5 MB is
  dead-lettered naming its topic, partition and offset and the limit; with the limit raised it decodes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from confluent_kafka import Producer
from sluice import FixedDelayRestart, JobClient, Pipeline
from sluice.connectors.kafka import KafkaSource
from sluice.sinks.files import FileSink

from tests.connectors.kafka.helpers import produce_json
from tests.faults.beyond import (
    SINKS,
    UNHANDLED_THREAD_ERRORS_FAIL,
    Output,
    check_exactly_once,
    completed,
    log_scenario,
    wait_until,
)
from tests.faults.contract import OVER_LIMIT, checkpoint_config, kafka_options, missing
from tests.kafka_broker import TansuBroker
from tests.sinks.conftest import read_visible

pytestmark = [pytest.mark.kafka, pytest.mark.usefixtures("kafka_reader"), UNHANDLED_THREAD_ERRORS_FAIL, pytest.mark.tansu(
    "stop maps from the fetched end (high_watermark.py); over-limit records stored because tansu has no size "
    "limit (message_size.py), as a Kafka with max.message.bytes raised would; no transactions or timestamps"
)]

SCHEMA = pa.schema([("id", pa.int64()), ("p", pa.int64()), ("ts", pa.int64())])


def kafka_job(name: str, broker: TansuBroker, topic: str, out: Output, chk: Path, **source: Any) -> Pipeline:
    p = Pipeline(
        name,
        parallelism=2,
        checkpoint=checkpoint_config(interval=0.1, storage=str(chk)),
        restart=FixedDelayRestart(attempts=3, delay=0.1),
    )
    src = KafkaSource(broker.bootstrap, topic, format="json", schema=SCHEMA, batch_size=50, **source)
    p.source(src).sink(out.sink())
    return p


def ends_by_itself(client: JobClient, out: Output, ids: list[int]) -> None:
    """Wait for the bounded run to end; fail if it runs on after committing the input plus ten checkpoints."""
    committed_at: list[int] = []  # checkpoints completed when the whole input was first seen committed

    def ended_or_hung() -> bool:
        if not client.running:
            return True
        if not committed_at and out.committed(ids):
            committed_at.append(completed(client))
        return bool(committed_at) and completed(client) >= committed_at[0] + 10

    wait_until(ended_or_hung, "the bounded rerun to end", every=0.25)
    if client.running:
        client.cancel()
        raise AssertionError(
            "the bounded rerun committed the whole input and ran on for 10 more checkpoints: it would never "
            f"end (its restored splits kept the first run's unbounded stop){missing()}"
        )


@pytest.mark.faults
@pytest.mark.parametrize("sink", SINKS)
def test_bounded_rerun_after_an_unbounded_run_ends_with_the_input(
    broker: TansuBroker, topic: Callable[..., str], tmp_path: Path, sink: str
) -> None:
    t = topic(2)
    out, chk = Output(sink, str(tmp_path / "out")), tmp_path / "chk"
    name = f"rerun-{sink}"
    ids = produce_json(broker, t, {0: range(0, 300), 1: range(1000, 1300)})
    first = kafka_job(name, broker, t, out, chk).start(runtime="local", restore="none", control_endpoint=None)
    wait_until(lambda: out.committed(ids), "the unbounded run to commit the input", first, every=0.25)
    assert first.cancel().status == "cancelled"
    ids += produce_json(broker, t, {0: range(300, 400), 1: range(1300, 1400)})
    stops = {(t, p): off for p, off in broker.end_offsets(t).items()}
    second = kafka_job(name, broker, t, out, chk, stopping_offsets=stops).start(
        runtime="local", restore="latest", control_endpoint=None
    )
    restored = any(chk.glob(f"{name}/chk-*/_metadata"))  # the rerun has the first run's checkpoint to restore
    ends_by_itself(second, out, ids)
    result = second.wait(60)
    got = out.ids()
    log_scenario("bounded-rerun", name, sink, restored, got, ids)
    assert result.status == "finished", f"{name}: {result.status}"
    check_exactly_once(name, got, ids)
    if sink != "files":
        check_exactly_once(f"{name} (read by another engine)", out.ids_independently(), ids)


# -- large records -----------------------------------------------------------------------------------------
BIG_SCHEMA = pa.schema([("id", pa.int64()), ("pad", pa.string())])
SIZES = {1: 600_000, 3: 1_000_000, 5: 1_500_000}  # offset -> value size; small records around them


def produce_sized(broker: TansuBroker, topic: str) -> dict[int, int]:
    """Records of the sizes of :data:`SIZES` at those offsets of partition 0, small ones between; returns
    {id: value size}. The producer's own limit is raised (its default is 1 MB)."""
    producer = Producer({"bootstrap.servers": broker.bootstrap, "message.max.bytes": 16_000_000, "log_level": 0})
    sizes: dict[int, int] = {}
    for i in range(7):
        n = SIZES.get(i, 100)
        head = json.dumps({"id": i, "pad": ""}).encode()
        value = head[:-2] + b"x" * (n - len(head)) + head[-2:]
        assert len(value) == n
        producer.produce(topic, value, partition=0)
        sizes[i] = n
    assert producer.flush(60) == 0, "the large records were not delivered"
    return sizes


@pytest.mark.faults
@pytest.mark.parametrize("limit", [None, 2_000_000], ids=["default-limit", "raised-limit"])
def test_large_records_with_a_schema_decode_and_one_over_the_limit_is_dead_lettered(
    broker: TansuBroker, topic: Callable[..., str], tmp_path: Path, limit: int | None
) -> None:
    t = topic(1)
    sizes = produce_sized(broker, t)
    end = broker.end_offsets(t)[0]
    assert end == len(sizes), f"the broker holds {end} records, {len(sizes)} were produced"
    over = {i for i, n in sizes.items() if n > (limit or 1 << 20)}
    p = Pipeline(
        f"large-{limit or 'default'}",
        parallelism=1,
        checkpoint=checkpoint_config(interval=0.2, storage=str(tmp_path / "chk")),
        restart=FixedDelayRestart(attempts=2, delay=0.1),
    )
    src = KafkaSource(
        broker.bootstrap, t, format="json", schema=BIG_SCHEMA, batch_size=10, on_bad_record="dead_letter",
        stopping_offsets={(t, 0): end}, **kafka_options(max_record_bytes=limit),
    )  # fmt: skip
    s = p.source(src)
    s.map_batches(
        lambda b: pa.RecordBatch.from_arrays(
            [b.column("id"), pc.utf8_length(b.column("pad"))], names=["id", "pad_length"]
        )
    ).sink(FileSink(str(tmp_path / "out"), format="parquet"))
    s.side_output("dead_letters").map_batches(
        lambda b: b.select(["topic", "partition", "offset", "error"]), name="dead-letter-columns"
    ).sink(FileSink(str(tmp_path / "dead"), format="parquet", name="dead-letters"))
    result = p.run(runtime="local", restore="none", control_endpoint=None)
    assert result.status == "finished"
    rows = read_visible(str(tmp_path / "out")).to_pylist()
    dead = read_visible(str(tmp_path / "dead")).to_pylist() if (tmp_path / "dead").exists() else []
    expected = sorted(set(sizes) - over)
    got = sorted(r["id"] for r in rows)
    log_scenario("large-records", f"limit-{limit}", "files", True, got, expected)
    check_exactly_once(f"records up to the limit (dead letters: {dead})", got, expected)
    pad = {r["id"]: r["pad_length"] for r in rows}
    for i in expected:  # the values decoded whole: their padding has the produced length
        assert pad[i] == sizes[i] - len(json.dumps({"id": i, "pad": ""})), f"record {i} decoded wrong"
    assert sorted(d["offset"] for d in dead) == sorted(over), f"dead letters: {dead}{missing()}"
    for d in dead:
        assert d["topic"] == t and d["partition"] == 0, d
        assert OVER_LIMIT.search(d["error"]), f"the dead letter does not name the limit: {d['error']}{missing()}"
