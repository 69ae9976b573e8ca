"""Formats beyond the built-in names: a decoder instance as ``format=``, and a named format added to the
registry (one module and one entry, as the Debezium and upsert formats will be)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from sluice.connectors.kafka import KafkaSource
from sluice.connectors.kafka.formats import FORMATS, Decoded, Format, FormatOptions, Messages
from sluice.connectors.kafka.reader import KafkaSourceReader
from sluice.errors import ConfigError
from sluice.sinks.testing import TwoPhaseCommitTestSink, read_committed
from sluice.source import SourceSplit

from tests.connectors.kafka.fakes import CollectingOutput, FakeConsumer, FakeMessage, FakeReaderContext
from tests.connectors.kafka.test_formats_e2e import pipeline, stops
from tests.kafka_broker import TansuBroker

pytestmark = [pytest.mark.kafka, pytest.mark.tansu(
    "decoders: plain records produced before the job, read to explicit stops from the fetched end (high_watermark.py); no transactions, timestamp lookups, out-of-range positions or new partitions"
)]

KV = pa.schema([("key", pa.string()), ("n", pa.int64()), ("deleted", pa.bool_())])


class KeyedCounts:
    """A keyed change format: key text, value an integer or null (a delete); counts the batches it saw."""

    def __init__(self) -> None:
        self.batches = 0

    def decode_messages(self, messages: Messages) -> Decoded:
        self.batches += 1
        keys: list[str] = []
        ns: list[int | None] = []
        rows: list[int] = []
        bad: list[tuple[int, str]] = []
        for i, (m, v) in enumerate(zip(messages.messages, messages.values, strict=True)):
            k = m.key()
            if k is None:
                bad.append((i, "a keyed record needs a key"))
                continue
            try:
                n = None if v is None else int(v)
            except ValueError as exc:
                bad.append((i, f"ValueError: {exc}"))
                continue
            keys.append(k.decode())
            ns.append(n)
            rows.append(i)
        batch = pa.RecordBatch.from_pydict(
            {"key": keys, "n": ns, "deleted": [n is None for n in ns]}, schema=KV
        )
        return Decoded(batch, np.asarray(rows, dtype=np.int64), bad)


@pytest.fixture(autouse=True)
def python_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake consumer stands in for confluent-kafka's: the sources here take today's reader."""
    monkeypatch.setenv("SLUICE_KAFKA_READER", "python")


def reader(monkeypatch: pytest.MonkeyPatch, src: KafkaSource) -> tuple[KafkaSourceReader, FakeConsumer]:
    consumers: list[FakeConsumer] = []

    def factory(conf: dict[str, object]) -> FakeConsumer:
        consumers.append(FakeConsumer(conf))
        return consumers[-1]

    monkeypatch.setattr(KafkaSourceReader, "consumer_factory", staticmethod(factory))
    src.validate()
    r = src.create_reader(FakeReaderContext())
    assert isinstance(r, KafkaSourceReader)
    r.start()
    return r, consumers[0]


def test_a_decoder_as_format_sees_keys_and_keeps_the_bad_record_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    src = KafkaSource(
        "localhost:9092", "t", format=KeyedCounts(), on_bad_record="dead_letter", include_metadata=True,
        fetch_thread=False,
    )
    r, consumer = reader(monkeypatch, src)
    r.add_splits([SourceSplit("t:0", 0)])
    consumer.batches = [
        [
            FakeMessage("t", 0, 0, b"3", k=b"a"),
            FakeMessage("t", 0, 1, None, k=b"a"),  # a delete: a row, not a tombstone to skip
            FakeMessage("t", 0, 2, b"x", k=b"b"),
            FakeMessage("t", 0, 3, b"4"),
        ]
    ]
    out = CollectingOutput()
    r.poll_next(out)
    (batch,) = out.batches
    assert batch.select(["key", "n", "deleted"]).to_pydict() == {"key": ["a", "a"], "n": [3, None], "deleted": [False, True]}
    assert batch.column("_offset").to_pylist() == [0, 1] and batch.column("_key").to_pylist() == [b"a", b"a"]
    dead = out.side["dead_letters"][0].to_pydict()
    assert dead["offset"] == [2, 3]
    assert dead["error"] == ["ValueError: invalid literal for int() with base 10: b'x'", "a keyed record needs a key"]
    assert r.snapshot_state(1)[0].position == 4  # bad records are consumed with the rest
    assert src.output_schema is None  # the decoder's schema is known when it decodes


def test_each_reader_decodes_with_its_own_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    given = KeyedCounts()
    src = KafkaSource("localhost:9092", "t", format=given, fetch_thread=False)
    r1, c1 = reader(monkeypatch, src)
    r2, _ = reader(monkeypatch, src)
    r1.add_splits([SourceSplit("t:0", 0)])
    c1.batches = [[FakeMessage("t", 0, 0, b"1", k=b"a")]]
    r1.poll_next(CollectingOutput())
    d1, d2 = r1._decoder, r2._decoder
    assert isinstance(d1, KeyedCounts) and isinstance(d2, KeyedCounts)
    assert d1 is not d2 and given not in (d1, d2)
    assert (d1.batches, d2.batches, given.batches) == (1, 0, 0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"format": KeyedCounts}, r"format must be one of \('raw', 'json', 'csv', 'avro', 'debezium-json', 'debezium-avro', 'upsert-json', "
         r"'upsert-avro'\) or a decoder"),
        ({"format": KeyedCounts(), "schema": KV}, "schema applies to the named formats"),
        ({"format": KeyedCounts(), "schema_registry": "http://r:8081"}, "schema_registry applies to format 'avro' or 'debezium-avro' or 'json' or 'upsert-avro' or 'upsert-json'"),
        ({"format": KeyedCounts(), "avro_schema": '"string"'}, "avro_schema applies to format 'avro'"),
    ],
)
def test_a_decoder_as_format_is_checked_at_build_time(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        KafkaSource("localhost:9092", "t", **kwargs).validate()  # type: ignore[arg-type]


class KeyedFormat(Format):
    """A named format: one class with its checks and its decoder, one registry entry."""

    name = "keyed"
    takes = frozenset({"schema_registry"})

    def check(self, options: FormatOptions) -> None:
        if options.value_schema is not None and options.value_schema != KV:
            raise ConfigError(f"KafkaSource: format 'keyed' has the schema {KV} (got {options.value_schema})")

    def decoder(self, options: FormatOptions) -> KeyedCounts:
        return KeyedCounts()

    def output_schema(self, options: FormatOptions) -> pa.Schema | None:
        return KV


def test_a_named_format_is_one_registry_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(FORMATS, "keyed", KeyedFormat())
    src = KafkaSource("localhost:9092", "t", format="keyed", fetch_thread=False)
    r, consumer = reader(monkeypatch, src)
    assert src.output_schema == KV
    r.add_splits([SourceSplit("t:0", 0)])
    consumer.batches = [[FakeMessage("t", 0, 0, b"7", k=b"z")]]
    out = CollectingOutput()
    r.poll_next(out)
    assert out.batches[0].to_pydict() == {"key": ["z"], "n": [7], "deleted": [False]}
    with pytest.raises(ConfigError, match="format 'keyed' has the schema"):
        KafkaSource("localhost:9092", "t", format="keyed", schema=pa.schema([("x", pa.int8())])).validate()
    with pytest.raises(ConfigError, match="schema_registry applies to format 'avro' or 'debezium-avro' or 'json' or 'keyed' or 'upsert-avro'"):
        KafkaSource("localhost:9092", "t", format="csv", schema_registry="http://r:8081").validate()


def test_a_decoder_as_format_in_a_job_is_exactly_once_with_dead_letters(
    broker: TansuBroker, topic: Callable[..., str], tmp_path: Path
) -> None:
    t = topic(2)
    expected: list[tuple[str, int]] = []
    bad = 0
    for part in (0, 1):
        keys = [f"k{part}-{i}".encode() for i in range(300)]
        values = [b"oops" if i % 50 == 9 else str(i).encode() for i in range(300)]
        broker.produce(t, values, partition=part, keys=keys)
        expected += [(k.decode(), i) for i, k in enumerate(keys) if i % 50 != 9]
        bad += sum(1 for i in range(300) if i % 50 == 9)
    p = pipeline("custom-format", tmp_path)
    stream = p.source(
        KafkaSource(
            broker.bootstrap, t, format=KeyedCounts(), on_bad_record="dead_letter", batch_size=64,
            stopping_offsets=stops(broker, t),
        )
    )
    stream.sink(TwoPhaseCommitTestSink(str(tmp_path / "out")))
    stream.side_output("dead_letters").sink(TwoPhaseCommitTestSink(str(tmp_path / "dead"), name="dead"), name="dead")
    p.run(runtime="local", restore="none")
    out = read_committed(str(tmp_path / "out"))
    dead = read_committed(str(tmp_path / "dead"))
    assert out is not None and dead is not None
    assert sorted(zip(out.column("key").to_pylist(), out.column("n").to_pylist(), strict=True)) == sorted(expected)
    assert dead.num_rows == bad and set(dead.column("value_text").to_pylist()) == {"oops"}
