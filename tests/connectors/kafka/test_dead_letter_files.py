"""Dead letters a person can read: text values as text, binary ones as base64, in named fields (issue 22)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from sluice.connectors.kafka import KafkaSource
from sluice.sinks.files import FileSink

from tests import listing
from tests.connectors.kafka.test_kafka_e2e import pipeline, stops
from tests.kafka_broker import TansuBroker

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.usefixtures("kafka_reader"),  # on both readers
    pytest.mark.tansu("how dead letters read in files; plain records to an explicit stop from the fetched end "
                      "(high_watermark.py): no tansu quirk touches it (the dead-letter topic on Apache Kafka: "
                      "test_kafka_e2e.py)"),
]


def test_dead_letter_json_files_show_the_record_as_text(
    broker: TansuBroker, topic: Callable[..., str], tmp_path: Path
) -> None:
    t = topic(1)
    binary = bytes(range(250, 256)) + b"\x00{"
    broker.produce(t, [b'{"id": 1}', b'{"id": 2, "name": "caf\xc3\xa9', binary], partition=0, keys=[None, b"k-2", b"\xff"])
    p = pipeline("dead-json", tmp_path, parallelism=1)
    stream = p.source(
        KafkaSource(
            broker.bootstrap,
            t,
            format="json",
            schema=pa.schema([("id", pa.int64())]),
            on_bad_record="dead_letter",
            stopping_offsets=stops(broker, t),
        )
    )
    stream.sink(FileSink(str(tmp_path / "out"), format="json"))
    stream.side_output("dead_letters").sink(FileSink(str(tmp_path / "dead"), format="json"), name="dead")
    p.run(runtime="local", restore="none")
    files = [f for f in listing.file_paths(tmp_path / "dead", "*.jsonl") if not f.name.startswith((".", "_"))]
    rows = sorted((json.loads(line) for f in files for line in f.read_text().splitlines()), key=lambda r: r["offset"])
    assert [r["offset"] for r in rows] == [1, 2]
    text, raw = rows
    assert text["value_text"] == '{"id": 2, "name": "café' and text["value_base64"] is None
    assert text["key_text"] == "k-2" and text["value_bytes"] == 24 and text["topic"] == t
    assert raw["value_text"] is None and base64.b64decode(raw["value_base64"]) == binary
    assert raw["key_text"] is None and base64.b64decode(raw["key_base64"]) == b"\xff"
    assert all(r["error"] and r["partition"] == 0 and r["timestamp"] for r in rows)
