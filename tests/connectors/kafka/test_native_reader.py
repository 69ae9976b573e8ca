"""The choice between the Kafka source's two readers, and what only the native one does itself (JSON
decoding in native code), judged against plain Python on the same input and against today's reader.

The rest of the native reader's semantics is shown by the Kafka tests that run on both readers (the
``kafka_reader`` fixture) and by the conformance kit's ``kafka_source_native`` case."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa
import pytest
from confluent_kafka import Producer
from sluice.connectors.kafka import KafkaSource, native_choice, native_wire
from sluice.connectors.kafka import native_reader as nr
from sluice.connectors.kafka.formats import Decoded, Messages
from sluice.errors import ConfigError
from sluice.sinks.testing import TwoPhaseCommitTestSink, read_committed

from tests.connectors.kafka.fakes import FakeReaderContext
from tests.connectors.kafka.registry_server import RecordedSchemaRegistry, avro_wire, json_wire
from tests.connectors.kafka.test_formats_units import EVENT_V1, EVENT_V2, ORDER_V1, ORDER_V2, order
from tests.connectors.kafka.test_kafka_e2e import pipeline, stops
from tests.kafka_broker import TansuBroker

SCHEMA = pa.schema([("id", pa.int64()), ("s", pa.string())])


# -- choosing the reader -------------------------------------------------------------------------------
def test_the_native_reader_is_built_here() -> None:
    """The suite runs where cargo is: the install built the extension (a missing build fails here, once,
    naming why, instead of silently testing today's reader twice)."""
    assert native_choice.native_problem(KafkaSource("localhost:9092", "t").options) is None


@pytest.mark.parametrize("bad", ["rust", "", None, 1])
def test_the_reader_option_is_checked(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"^KafkaSource: reader must be one of \('auto', 'native', 'python'\)"):
        KafkaSource("localhost:9092", "t", reader=bad).validate()  # type: ignore[arg-type]


def test_the_environment_may_pin_the_default_and_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_KAFKA_READER", "python")
    assert KafkaSource("localhost:9092", "t").options.reader == "python"
    assert KafkaSource("localhost:9092", "t", reader="native").options.reader == "native"  # an explicit one wins
    monkeypatch.setenv("SLUICE_KAFKA_READER", "fast")
    with pytest.raises(ConfigError, match=r"SLUICE_KAFKA_READER must be one of \('auto', 'native', 'python'\)"):
        KafkaSource("localhost:9092", "t")


def _choose(src: KafkaSource, caplog: pytest.LogCaptureFixture) -> tuple[type, list[str]]:
    with caplog.at_level(logging.INFO, logger="sluice.kafka"):
        caplog.clear()
        reader = src.create_reader(FakeReaderContext())
    return type(reader), [r.getMessage() for r in caplog.records if "reader (" in r.getMessage()]


def test_auto_takes_the_native_reader_and_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    src = KafkaSource("localhost:9092", "t", name="auto-native-once")
    kind, lines = _choose(src, caplog)
    assert kind is nr.NativeKafkaSourceReader
    assert lines == ["KafkaSource 'auto-native-once': native reader (librdkafka 2.12.1, fetch and decoding without the GIL)"]
    assert _choose(src, caplog)[1] == []  # one line per source and process, not one per subtask


def test_python_is_today_s_reader(caplog: pytest.LogCaptureFixture) -> None:
    kind, lines = _choose(KafkaSource("localhost:9092", "t", reader="python", name="pinned"), caplog)
    assert kind is nr.KafkaSourceReader and lines == ["KafkaSource 'pinned': python reader (reader='python')"]


def test_settings_the_native_librdkafka_refuses_fall_back_or_are_refused(caplog: pytest.LogCaptureFixture) -> None:
    # the native librdkafka is built without OpenSSL (native/Cargo.toml): TLS stays with today's reader
    conf = {"security.protocol": "ssl"}
    kind, lines = _choose(KafkaSource("localhost:9092", "t", consumer_config=conf, name="tls"), caplog)
    assert kind is nr.KafkaSourceReader
    assert len(lines) == 1 and lines[0].startswith("KafkaSource 'tls': python reader (the native reader cannot run: ")
    assert "security.protocol" in lines[0]
    with pytest.raises(ConfigError, match=r"^KafkaSource 'kafka': reader='native' cannot run: .*security\.protocol"):
        KafkaSource("localhost:9092", "t", consumer_config=conf, reader="native").validate()


def test_a_callback_the_native_consumer_does_not_serve_falls_back(caplog: pytest.LogCaptureFixture) -> None:
    conf = {"throttle_cb": lambda *_: None}
    kind, lines = _choose(KafkaSource("localhost:9092", "t", consumer_config=conf, name="cb"), caplog)
    assert kind is nr.KafkaSourceReader and "throttle_cb" in lines[0]
    with pytest.raises(ConfigError, match="throttle_cb"):
        KafkaSource("localhost:9092", "t", consumer_config=conf, reader="native").validate()


def test_without_the_extension_auto_falls_back_and_native_is_refused(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(native_choice, "_native", None)
    monkeypatch.setattr(native_choice, "_MISSING", "the extension sluice.connectors.kafka._native is not built (test)")
    kind, lines = _choose(KafkaSource("localhost:9092", "t", name="unbuilt"), caplog)
    assert kind is nr.KafkaSourceReader and "is not built (test)" in lines[0]
    with pytest.raises(ConfigError) as err:
        KafkaSource("localhost:9092", "t", reader="native").validate()
    assert "\n" not in str(err.value) and "is not built (test)" in str(err.value)


# -- JSON decoded natively, against plain Python and today's reader ---------------------------------------
#: values of every kind a JSON batch meets; the expected row (or None: a bad record) per plain Python
VALUES: list[bytes | None] = [
    b'{"id": 1, "s": "a"}',
    b'{"id": 2}',  # missing field: null
    b'{"id": 3, "s": "c", "extra": [1, {"x": 2}]}',  # unknown field: ignored
    b"{oops",
    b"42",
    b"[1, 2]",
    b'{"id": 4}{"id": 5}',  # two objects in one value
    b"",
    b"   ",
    b'{"id": "x"}',
    b'{"id": null, "s": null}',
    b"",
    None,  # a tombstone: skipped and counted
    b'{"id": 6,\n "s": "multi\\nline"}',
    b'{"id": 7, "s": "\xc3\xa9t\xc3\xa9"}',
    b'{"s": 5}',
    b'{"id": true}',
    b'{"id": "7"}',  # a number as text
    b'{"id": 1.5}',
    b'{"id": 1e3}',
    b'{"id": 99999999999999999999}',
    b'{"id": 8, "s": "tail"}\n',
    b'{"id": 9, "s": "x"} trailing',
    b'{"id": 10, "s": "' + b"y" * 300 + b'"}',  # over max_record_bytes (200)
]


def _reference(v: bytes | None) -> dict[str, Any] | None:
    """The row plain Python makes of a value under SCHEMA (None: a bad record or a tombstone)."""
    if v is None or len(v) > 200:
        return None
    try:
        obj = json.loads(v)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    row = {"id": obj.get("id"), "s": obj.get("s")}
    ok_id = row["id"] is None or (isinstance(row["id"], int) and not isinstance(row["id"], bool) and -(2**63) <= row["id"] < 2**63)
    ok_s = row["s"] is None or isinstance(row["s"], str)
    return row if ok_id and ok_s else None


def _run(broker: TansuBroker, t: str, tmp_path: Path, reader: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    out, dead = tmp_path / f"out-{reader}", tmp_path / f"dead-{reader}"
    p = pipeline(f"json-{reader}", tmp_path / reader, parallelism=1)
    s = p.source(
        KafkaSource(
            broker.bootstrap, t, format="json", schema=SCHEMA, on_bad_record="dead_letter", include_metadata=True,
            max_record_bytes=200, stopping_offsets=stops(broker, t), reader=reader, batch_size=7,
        )
    )  # fmt: skip
    s.sink(TwoPhaseCommitTestSink(str(out)))
    s.side_output("dead_letters").sink(TwoPhaseCommitTestSink(str(dead)), name="dead")
    p.run(runtime="local", restore="none")
    rows, bad = read_committed(str(out)), read_committed(str(dead))
    return (
        rows.sort_by("_offset").to_pylist() if rows is not None else [],
        bad.sort_by("offset").to_pylist() if bad is not None else [],
    )


def test_json_decoded_natively_matches_plain_python_and_today_s_reader(
    broker: TansuBroker, topic: Callable[..., str], tmp_path: Path
) -> None:
    t = topic(1)
    prod = Producer({"bootstrap.servers": broker.bootstrap, "log_level": 0})
    for i, v in enumerate(VALUES):
        prod.produce(t, v, key=f"k{i}".encode(), partition=0)
    prod.flush(10)
    expected = {i: r for i, v in enumerate(VALUES) if (r := _reference(v)) is not None}
    expected_bad = [i for i, v in enumerate(VALUES) if v is not None and _reference(v) is None]
    results = {reader: _run(broker, t, tmp_path, reader) for reader in ("native", "python")}
    for reader, (rows, bad) in results.items():
        assert {r["_offset"]: {"id": r["id"], "s": r["s"]} for r in rows} == expected, reader
        assert [r["_key"] for r in rows] == [f"k{i}".encode() for i in expected], reader
        assert [d["offset"] for d in bad] == expected_bad, (reader, bad)
        assert all(d["topic"] == t and d["partition"] == 0 and d["error"] for d in bad), reader
        too_long = [d for d in bad if d["offset"] == len(VALUES) - 1]
        assert "over max_record_bytes (200)" in too_long[0]["error"], reader
    native_rows, python_rows = results["native"][0], results["python"][0]
    assert [dict(r, _timestamp=None) for r in native_rows] == [dict(r, _timestamp=None) for r in python_rows]
    assert [r["_timestamp"] for r in native_rows] == [r["_timestamp"] for r in python_rows]


# -- the schema registry's wire format decoded natively, against fastavro / json and today's reader ---------
def _run_registry(broker: TansuBroker, t: str, tmp_path: Path, reader: str, fmt: str, url: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    out, dead = tmp_path / f"out-{fmt}-{reader}", tmp_path / f"dead-{fmt}-{reader}"
    p = pipeline(f"{fmt}-sr-{reader}", tmp_path / f"{fmt}-{reader}", parallelism=1)
    s = p.source(
        KafkaSource(
            broker.bootstrap, t, format=fmt, schema_registry=url, on_bad_record="dead_letter", include_metadata=True,
            max_record_bytes=2000, stopping_offsets=stops(broker, t), reader=reader, batch_size=16,
        )
    )  # fmt: skip
    s.sink(TwoPhaseCommitTestSink(str(out)))
    s.side_output("dead_letters").sink(TwoPhaseCommitTestSink(str(dead)), name="dead")
    p.run(runtime="local", restore="none")
    rows, bad = read_committed(str(out)), read_committed(str(dead))
    return (
        rows.sort_by("_offset").to_pylist() if rows is not None else [],
        bad.sort_by("offset").to_pylist() if bad is not None else [],
    )


def _registry_readers(broker: TansuBroker, t: str, tmp_path: Path, fmt: str, url: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    results = {}
    for reader in ("native", "python"):
        before = native_wire.RECORDS["native"]
        results[reader] = _run_registry(broker, t, tmp_path, reader, fmt, url)
        assert (native_wire.RECORDS["native"] > before) == (reader == "native"), reader
    (rows, bad), (py_rows, py_bad) = results["native"], results["python"]
    assert rows == py_rows  # metadata and timestamps included
    assert [dict(d, error=None) for d in bad] == [dict(d, error=None) for d in py_bad]  # the texts may differ
    return rows, bad


def test_avro_from_the_registry_decoded_natively_matches_fastavro_and_today_s_reader(
    broker: TansuBroker, topic: Callable[..., str], registry: RecordedSchemaRegistry, tmp_path: Path
) -> None:
    t = topic(1)
    i1, i2 = registry.register("orders-value", ORDER_V1), registry.register("orders-value", ORDER_V2)
    values: list[bytes | None] = []
    for i in range(120):
        values.append(avro_wire(i1, ORDER_V1, order(i)) if i % 3 else avro_wire(i2, ORDER_V2, order(i, currency="USD")))
    malformed = {
        20: values[20][:-3],  # truncated
        45: values[45] + b"\x00",  # a byte left after the record
        46: b'{"not": "avro"}',  # no wire-format header
        70: b"\x00\x00\x00",  # a header cut short
        71: avro_wire(i1, ORDER_V1, order(71))[:1] + (999).to_bytes(4, "big") + b"\x02",  # an unknown id
        90: avro_wire(i1, ORDER_V1, order(90, customer="x" * 3000)),  # over max_record_bytes
        100: None,  # a tombstone
    }
    values = [malformed.get(i, v) for i, v in enumerate(values)]
    broker.produce(t, values, partition=0)
    rows, bad = _registry_readers(broker, t, tmp_path, "avro", registry.url)
    # the reference: fastavro on each value, the newest schema (id 2) as the reader schema
    reader = fastavro.parse_schema(dict(ORDER_V2))
    expected = {}
    for i, v in enumerate(values):
        if v is None or len(v) > 2000 or len(v) < 5 or v[0] != 0 or int.from_bytes(v[1:5], "big") not in (i1, i2):
            continue
        writer = fastavro.parse_schema(dict(ORDER_V1 if int.from_bytes(v[1:5], "big") == i1 else ORDER_V2))
        fo = io.BytesIO(v[5:])
        try:
            rec = fastavro.schemaless_reader(fo, writer, reader)
        except Exception:
            continue
        if fo.tell() == len(v) - 5:
            expected[i] = rec
    assert len(expected) == 120 - len(malformed)
    assert {r["_offset"]: {k: r[k] for k in expected[0]} for r in rows} == expected
    assert [d["offset"] for d in bad] == sorted(set(malformed) - {100})
    assert all(d["topic"] == t and d["partition"] == 0 and d["error"] for d in bad)
    errors = {d["offset"]: d["error"] for d in bad}
    assert "unknown schema id 999" in errors[71] and "not in the Confluent wire format" in errors[46]
    assert "over max_record_bytes (2000)" in errors[90] and "left after the record" in errors[45]


def test_json_schema_from_the_registry_decoded_natively_matches_json_and_today_s_reader(
    broker: TansuBroker, topic: Callable[..., str], registry: RecordedSchemaRegistry, tmp_path: Path
) -> None:
    t = topic(1)
    i4, i5 = registry.register("events-value", EVENT_V1, "JSON"), registry.register("events-value", EVENT_V2, "JSON")
    values: list[bytes | None] = []
    for i in range(120):
        if i % 2:
            values.append(json_wire(i4, {"id": i, "kind": "k", "score": i, "tags": ["a", str(i)]}))
        else:
            values.append(json_wire(i5, {"id": i, "kind": "k", "score": i + 0.5, "source": "s"}))
    malformed = {
        21: json_wire(i4, {"id": "x", "kind": "k"}),  # a string for an integer
        40: b"\x00" + i5.to_bytes(4, "big") + b"{oops",  # not JSON
        41: json_wire(i4, [1, 2]),  # not an object
        60: b'{"id": 60}',  # no wire-format header
        61: b"\x00" + (999).to_bytes(4, "big") + b"{}",  # an unknown id
        80: None,  # a tombstone
    }
    values = [malformed.get(i, v) for i, v in enumerate(values)]
    broker.produce(t, values, partition=0)
    rows, bad = _registry_readers(broker, t, tmp_path, "json", registry.url)
    expected = {}
    for i, v in enumerate(values):
        if v is None or v[:1] != b"\x00" or int.from_bytes(v[1:5], "big") not in (i4, i5):
            continue
        try:
            obj = json.loads(v[5:])
        except ValueError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("id"), int):
            expected[i] = {k: obj.get(k) for k in ("id", "kind", "score", "tags", "source")}
    assert len(expected) == 120 - len(malformed)
    assert {r["_offset"]: {k: r[k] for k in ("id", "kind", "score", "tags", "source")} for r in rows} == expected
    assert [d["offset"] for d in bad] == sorted(set(malformed) - {80})
    assert all(d["topic"] == t and d["partition"] == 0 and d["error"] for d in bad)


# -- a decoder of your own sees the same messages on the native reader ------------------------------------
class Echo:
    """A decoder of one's own reading every accessor of the messages (the documented ``messages.messages``)."""

    def decode_messages(self, messages: Messages) -> Decoded:
        ms = messages.messages
        batch = pa.RecordBatch.from_pydict(
            {
                "topic": [m.topic() for m in ms],
                "partition": [m.partition() for m in ms],
                "offset": [m.offset() for m in ms],
                "key": [m.key() for m in ms],
                "value": [m.value() for m in ms],
                "ts": [m.timestamp()[1] for m in ms],
                "headers": [json.dumps([[k, v.decode() if v else None] for k, v in (m.headers() or [])]) for m in ms],
                "same_values": [m.value() == v for m, v in zip(ms, messages.values, strict=True)],
            }
        )
        return Decoded(batch, np.arange(len(ms), dtype=np.int64))


def test_a_decoder_of_your_own_sees_the_same_messages_on_both_readers(
    broker: TansuBroker, topic: Callable[..., str], tmp_path: Path
) -> None:
    t = topic(2)
    prod = Producer({"bootstrap.servers": broker.bootstrap, "log_level": 0})
    for i in range(6):
        hdrs = [("a", b"1"), ("b", None)] if i % 2 else None
        prod.produce(t, None if i == 3 else b"v%d" % i, key=b"k%d" % i, partition=i % 2, headers=hdrs,
                     timestamp=1_700_000_000_000 + i)  # fmt: skip
    prod.flush(10)
    got = {}
    for reader in ("native", "python"):
        p = pipeline(f"echo-{reader}", tmp_path / reader, parallelism=2)
        p.source(KafkaSource(broker.bootstrap, t, format=Echo(), stopping_offsets=stops(broker, t), reader=reader)).sink(
            TwoPhaseCommitTestSink(str(tmp_path / f"out-{reader}"))
        )
        p.run(runtime="local", restore="none")
        out = read_committed(str(tmp_path / f"out-{reader}"))
        assert out is not None
        got[reader] = out.sort_by([("partition", "ascending"), ("offset", "ascending")]).to_pylist()
    assert got["native"] == got["python"]
    assert [(r["key"], r["value"], r["ts"]) for r in got["native"]] == [
        (b"k%d" % i, None if i == 3 else b"v%d" % i, 1_700_000_000_000 + i) for i in (0, 2, 4, 1, 3, 5)
    ]
    assert [json.loads(r["headers"]) for r in got["native"]][3:] == [[["a", "1"], ["b", None]]] * 3
    assert all(r["same_values"] for r in got["native"])
