"""Records up to ``max_record_bytes`` (Kafka's default 1 MiB) decode with a schema; larger ones are bad
records naming topic, partition and offset (issue 21, point 5).

The JSON decoder parsed in 256 KiB blocks, so a valid record over that failed under a schema ("straddling
object"). tansu accepts records of any size (tests/broker_quirks/message_size.py): the producer here
raises librdkafka's own 1 MB ``message.max.bytes`` so 1 MB records reach it.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from confluent_kafka import Producer
from sluice.config import NoRestart
from sluice.connectors.kafka import KafkaSource
from sluice.errors import BadRecordError, ConfigError, JobFailedError
from sluice.sinks.testing import TwoPhaseCommitTestSink, read_committed

from tests.connectors.kafka.test_kafka_e2e import pipeline, stops
from tests.kafka_broker import TansuBroker

pytestmark = [pytest.mark.kafka, pytest.mark.usefixtures("kafka_reader"), pytest.mark.tansu(
    "sluice's max_record_bytes, not the broker's limit: tansu's missing size limit (message_size.py) lets the over-limit records in, as a Kafka with max.message.bytes raised would; plain records produced before the job, read to explicit stops from the fetched end (high_watermark.py); no transactions, timestamp lookups, out-of-range positions or new partitions"
)]

SCHEMA = pa.schema([("id", pa.int64()), ("s", pa.string())])
AVRO = {
    "type": "record",
    "name": "Big",
    "fields": [{"name": "id", "type": "long"}, {"name": "s", "type": "string"}],
}
MiB = 1024 * 1024


def _json(i: int, size: int) -> bytes:
    """A JSON record of exactly ``size`` bytes."""
    head = json.dumps({"id": i, "s": ""}).encode()
    return json.dumps({"id": i, "s": "x" * (size - len(head))}).encode()


def _avro(i: int, size: int) -> bytes:
    """An Avro record of exactly ``size`` bytes."""

    def encode(n: int) -> bytes:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, fastavro.parse_schema(AVRO), {"id": i, "s": "y" * n})
        return out.getvalue()

    n = size - len(encode(0))
    while len(encode(n)) > size:  # the string's length prefix grows with it
        n -= 1
    return encode(n)


def produce_large(broker: TansuBroker, topic: str, values: list[bytes]) -> None:
    producer = Producer(
        {"bootstrap.servers": broker.bootstrap, "message.max.bytes": 64 * MiB, "log_level": 0}
    )
    errors: list[Any] = []
    for v in values:
        producer.produce(topic, v, partition=0, on_delivery=lambda e, _m: errors.append(e) if e else None)
        producer.poll(0)
    assert producer.flush(60) == 0 and not errors, errors


def _run(
    broker: TansuBroker, t: str, tmp_path: Path, fmt: str, **options: Any
) -> tuple[pa.Table | None, pa.Table | None]:
    p = pipeline("large", tmp_path, parallelism=1, restart=NoRestart())
    decoding: dict[str, Any] = {"schema": SCHEMA} if fmt == "json" else {"avro_schema": AVRO}
    stream = p.source(
        KafkaSource(broker.bootstrap, t, format=fmt, stopping_offsets=stops(broker, t), **decoding, **options)
    )
    stream.sink(TwoPhaseCommitTestSink(str(tmp_path / "out")))
    if options.get("on_bad_record") == "dead_letter":
        stream.side_output("dead_letters").sink(TwoPhaseCommitTestSink(str(tmp_path / "dead"), name="dead"))
    p.run(runtime="local", restore="none")
    return read_committed(str(tmp_path / "out")), read_committed(str(tmp_path / "dead"))


@pytest.mark.parametrize("fmt", ["json", "avro"])
def test_records_up_to_one_mib_decode_with_a_schema(
    broker: TansuBroker, topic: Callable[..., str], tmp_path: Path, fmt: str
) -> None:
    t = topic(1)
    encode = _json if fmt == "json" else _avro
    sizes = [100, 600_000, 200, 1_000_000, MiB, 300, 600_000]
    produce_large(broker, t, [encode(i, n) for i, n in enumerate(sizes)])
    out, _ = _run(broker, t, tmp_path, fmt)
    assert out is not None
    assert out.column("id").to_pylist() == list(range(len(sizes)))
    assert all(len(s) > n - 40 for s, n in zip(out.column("s").to_pylist(), sizes, strict=True))


@pytest.mark.parametrize("fmt", ["json", "avro"])
def test_a_record_over_the_limit_is_dead_lettered_naming_its_position(
    broker: TansuBroker, topic: Callable[..., str], tmp_path: Path, fmt: str
) -> None:
    t = topic(1)
    encode = _json if fmt == "json" else _avro
    produce_large(broker, t, [encode(0, 500), encode(1, MiB + 1), encode(2, 10 * MiB), encode(3, 500)])
    out, dead = _run(broker, t, tmp_path, fmt, on_bad_record="dead_letter")
    assert out is not None and out.column("id").to_pylist() == [0, 3]
    assert dead is not None
    assert dead.column("offset").to_pylist() == [1, 2]
    assert dead.column("topic").to_pylist() == [t, t]
    errors = dead.column("error").to_pylist()
    assert all("max_record_bytes" in e and "1048576" in e for e in errors), errors


def test_a_record_over_the_limit_fails_the_job_naming_topic_partition_offset(
    broker: TansuBroker, topic: Callable[..., str], tmp_path: Path
) -> None:
    t = topic(1)
    produce_large(broker, t, [_json(0, 500), _json(1, 2 * MiB)])
    with pytest.raises(JobFailedError) as info:
        _run(broker, t, tmp_path, "json")
    cause = info.value.__cause__ or info.value
    text = str(info.value)
    assert "max_record_bytes" in text and f"topic={t!r}" in text and "offset=1" in text, text
    assert isinstance(cause, BadRecordError) or "BadRecordError" in text


def test_max_record_bytes_raises_the_limit(
    broker: TansuBroker, topic: Callable[..., str], tmp_path: Path
) -> None:
    t = topic(1)
    produce_large(broker, t, [_json(0, 3 * MiB), _json(1, 100)])
    out, _ = _run(broker, t, tmp_path, "json", max_record_bytes=4 * MiB)
    assert out is not None and out.column("id").to_pylist() == [0, 1]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "1MB"])
def test_max_record_bytes_is_checked(bad: object) -> None:
    with pytest.raises(ConfigError, match="max_record_bytes must be"):
        KafkaSource("localhost:9092", "t", format="json", max_record_bytes=bad).validate()  # type: ignore[arg-type]
