"""Decoders without a broker: Avro (columnar against fastavro), schema-registry formats against the recorded
registry, steady JSON schemas, the fetch thread's budget."""

from __future__ import annotations

import io
import json
import random
import socket
import struct
import threading
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa
import pytest
from sluice.connectors.kafka import KafkaSource
from sluice.connectors.kafka.errors import (
    IncompatibleSchemaError,
    SchemaNotFoundError,
    SchemaRegistryError,
    UnsupportedSchemaError,
)
from sluice.connectors.kafka.fetcher import Fetcher, split_messages
from sluice.connectors.kafka.formats import make_decoder
from sluice.connectors.kafka.formats.avro_columnar import PAD
from sluice.connectors.kafka.formats.avro_schema import AvroSchema, read_records
from sluice.connectors.kafka.formats.csv import CsvDecoder
from sluice.connectors.kafka.formats.json import JsonDecoder
from sluice.connectors.kafka.formats.json_schema import json_schema_to_arrow
from sluice.connectors.kafka.formats.schema_registry import (
    SchemaRegistry,
    SchemaRegistryClient,
    split_wire_format,
)
from sluice.connectors.kafka.formats.schemas import align, widen
from sluice.connectors.kafka.options import KafkaSourceOptions

from tests.connectors.kafka.fakes import FakeMessage
from tests.connectors.kafka.registry_server import RECORDINGS, RecordedSchemaRegistry, avro_wire, json_wire

pytestmark = pytest.mark.kafka


def recorded_schema(schema_id: int) -> dict[str, Any]:
    """The schema the recordings serve for ``schema_id``."""
    for ex in json.loads(RECORDINGS.read_text())["exchanges"]:
        if ex["request"]["path"] == f"/schemas/ids/{schema_id}" and ex["response"]["status"] == 200:
            return dict(json.loads(ex["response"]["body"]["schema"]))
    raise KeyError(schema_id)


ORDER_V1, ORDER_V2, ORDER_V3 = recorded_schema(1), recorded_schema(2), recorded_schema(3)
EVENT_V1, EVENT_V2, EVENT_V3 = recorded_schema(4), recorded_schema(5), recorded_schema(6)


def order(i: int, **extra: Any) -> dict[str, Any]:
    return {
        "id": i,
        "customer": f"cust-{i}-é",
        "amount": i + 0.25,
        "status": ["NEW", "PAID", "SHIPPED"][i % 3],
        "placed_at": 1_700_000_000_000 + i,
        "note": None if i % 2 else f"n{i}",
        **extra,
    }


def source(**kwargs: Any) -> KafkaSourceOptions:
    return KafkaSource("localhost:9092", "t", **kwargs).options


# -- Avro: the columnar decoder agrees with fastavro ------------------------------------------------------
RICH = {
    "type": "record",
    "name": "Rich",
    "fields": [
        {"name": "b", "type": "boolean"},
        {"name": "i", "type": "int"},
        {"name": "l", "type": "long"},
        {"name": "f", "type": "float"},
        {"name": "d", "type": "double"},
        {"name": "s", "type": "string"},
        {"name": "raw", "type": "bytes"},
        {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]}},
        {"name": "fx", "type": {"type": "fixed", "name": "F4", "size": 4}},
        {"name": "opt", "type": ["null", "long"]},
        {"name": "opt2", "type": ["string", "null"]},
        {
            "name": "inner",
            "type": {
                "type": "record",
                "name": "Inner",
                "fields": [{"name": "x", "type": "int"}, {"name": "tag", "type": ["null", "string"]}],
            },
        },
        {"name": "nothing", "type": "null"},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "uid", "type": {"type": "string", "logicalType": "uuid"}},
    ],
}


def rich(rng: random.Random) -> dict[str, Any]:
    return {
        "b": rng.random() < 0.5,
        "i": rng.randint(-(2**31), 2**31 - 1),
        "l": rng.choice([0, -1, 1, 2**63 - 1, -(2**63), rng.randint(-(10**12), 10**12)]),
        "f": rng.choice([0.5, -1.25, 3.0e10]),
        "d": rng.uniform(-1e9, 1e9),
        "s": rng.choice(["", "ascii", "ünïcödé ✓", "x" * 300]),
        "raw": bytes(rng.randrange(256) for _ in range(rng.randrange(20))),
        "e": rng.choice(["A", "B", "C"]),
        "fx": bytes(rng.randrange(256) for _ in range(4)),
        "opt": rng.choice([None, rng.randint(-5, 5)]),
        "opt2": rng.choice([None, "v"]),
        "inner": {"x": rng.randint(-100, 100), "tag": rng.choice([None, "t"])},
        "nothing": None,
        "day": rng.randint(0, 30_000),
        "at": rng.randint(0, 2**50),
        "uid": "0f8fad5b-d9cb-469f-a165-70867728950e",
    }


def encode(schema: dict[str, Any], records: list[dict[str, Any]]) -> list[bytes]:
    parsed = fastavro.parse_schema(schema)
    out = []
    for r in records:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, r)
        out.append(buf.getvalue())
    return out


def columns(payloads: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lens = np.array([len(p) for p in payloads], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
    return np.frombuffer(b"".join([*payloads, bytes(PAD)]), dtype=np.uint8), starts, starts + lens


def test_columnar_avro_equals_fastavro_on_every_supported_type() -> None:
    schema = AvroSchema(RICH)
    assert schema.plan is not None, "every type of RICH is in the columnar plan"
    payloads = encode(RICH, [rich(random.Random(seed)) for seed in range(500)])
    arr, bad = schema.plan.decode(*columns(payloads))
    assert not bad.any()
    columnar = pa.RecordBatch.from_struct_array(arr)
    reference, good, errors = read_records(payloads, schema, schema)  # fastavro, record by record
    assert errors == [] and good == list(range(500))
    assert columnar.equals(reference)
    assert schema.logical.field("at").type == pa.timestamp("us", tz="UTC")
    assert schema.logical.field("day").type == pa.date32() and schema.logical.field("uid").type == pa.string()


def test_columnar_avro_flags_corrupt_records_and_keeps_the_rest() -> None:
    schema = AvroSchema(RICH)
    assert schema.plan is not None
    rng = random.Random(7)
    good = encode(RICH, [rich(rng) for _ in range(6)])
    corrupt = [
        good[0][:-2],  # truncated
        good[1] + b"\x00",  # a byte left over
        b"\x02" + good[2][1:],  # boolean byte 1 -> fine, then misaligned from a wrong varint below
        good[3][:9] + b"\xff" * 12 + good[3][21:],  # a varint longer than 10 bytes
    ]
    payloads = [good[4], *corrupt, good[5]]
    _, bad = schema.plan.decode(*columns(payloads))
    assert not bad[0] and not bad[-1]
    assert bad[1] and bad[2] and bad[4]
    decoder = make_decoder(source(format="avro", avro_schema=RICH))
    assert decoder is not None
    r = decoder.decode(payloads)  # type: ignore[arg-type]
    assert r.batch is not None
    kept = [] if r.rows is None else r.rows.tolist()
    assert 0 in kept and 5 in kept and {i for i, _ in r.bad} | set(kept) == set(range(6))
    assert {i for i, _ in r.bad} >= {1, 2, 4}
    messages = dict(r.bad)
    assert "truncated Avro record for avro_schema" in messages[1]
    assert "1 byte(s) left after the record" in messages[2]


def test_plain_avro_with_avro_schema_option() -> None:
    decoder = make_decoder(source(format="avro", avro_schema=json.dumps(ORDER_V1)))
    assert decoder is not None
    r = decoder.decode([*encode(ORDER_V1, [order(i) for i in range(4)]), None])  # type: ignore[operator]
    assert r.tombstones == 1 and r.bad == [] and r.batch is not None
    assert r.batch.column("status").to_pylist() == ["NEW", "PAID", "SHIPPED", "NEW"]
    assert r.batch.schema.field("placed_at").type == pa.timestamp("ms", tz="UTC")


def test_unsupported_avro_unions_are_refused_naming_the_field() -> None:
    bad = {"type": "record", "name": "R", "fields": [{"name": "u", "type": ["int", "string"]}]}
    with pytest.raises(UnsupportedSchemaError, match=r"avro_schema.u: a union of several non-null types"):
        AvroSchema(bad)
    nested = {
        "type": "record",
        "name": "R",
        "fields": [{"name": "xs", "type": {"type": "array", "items": "long"}}, {"name": "m", "type": {"type": "map", "values": "string"}}],
    }
    s = AvroSchema(nested)
    assert s.plan is None  # arrays and maps go through fastavro
    assert s.logical.field("xs").type == pa.list_(pa.int64())
    r = make_decoder(source(format="avro", avro_schema=nested)).decode(  # type: ignore[union-attr]
        encode(nested, [{"xs": [1, 2], "m": {"a": "b"}}])
    )
    assert r.batch is not None and r.batch.to_pydict() == {"xs": [[1, 2]], "m": [[("a", "b")]]}


# -- schema registry ------------------------------------------------------------------------------------
def test_wire_format_ids_are_split_vectorized() -> None:
    ids, ok = split_wire_format([b"\x00\x00\x00\x00\x07ab", b"\x01\x00\x00\x00\x07", b"\x00\x00", b"\x00\x01\x00\x00\x00"])
    assert ids.tolist() == [7, -1, -1, 1 << 24] and ok.tolist() == [True, False, False, True]


def test_registry_client_fetches_each_id_once_and_names_unknown_ids(registry: RecordedSchemaRegistry) -> None:
    client = SchemaRegistryClient(SchemaRegistry(registry.url))
    threads = [threading.Thread(target=client.schema, args=(1,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert client.schema(1).schema_type == "AVRO" and client.schema(4).schema_type == "JSON"
    assert registry.requests["GET /schemas/ids/1"] == 1 and registry.requests["GET /schemas/ids/4"] == 1
    for _ in range(3):
        with pytest.raises(SchemaNotFoundError, match="unknown schema id 999") as info:
            client.schema(999)
    assert info.value.schema_id == 999
    assert registry.requests["GET /schemas/ids/999"] == 1  # remembered for a while: no request storm


def test_registry_unreachable_fails_after_retries() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = SchemaRegistryClient(SchemaRegistry(f"http://127.0.0.1:{port}", timeout_s=1))
    with pytest.raises(SchemaRegistryError, match="cannot reach the schema registry"):
        client.schema(1)
    assert client.requests == 4


def test_registry_credentials_are_never_shown() -> None:
    conf = SchemaRegistry.of("https://key:s3cr%21t@registry.example:8081")
    assert conf.url == "https://registry.example:8081" and conf.password == "s3cr!t"
    assert "s3cr" not in repr(conf)
    assert "s3cr" not in repr(source(format="avro", schema_registry=conf))


def test_avro_ids_evolve_into_the_newest_schema(registry: RecordedSchemaRegistry) -> None:
    i1 = registry.register("orders-value", ORDER_V1)
    i2 = registry.register("orders-value", ORDER_V2)
    decoder = make_decoder(source(format="avro", schema_registry=registry.url))
    assert decoder is not None
    r = decoder.decode([avro_wire(i1, ORDER_V1, order(0)), avro_wire(i1, ORDER_V1, order(1))])
    assert r.batch is not None and "currency" not in r.batch.schema.names
    r = decoder.decode(
        [avro_wire(i1, ORDER_V1, order(2)), avro_wire(i2, ORDER_V2, order(3, currency="USD")), avro_wire(i1, ORDER_V1, order(4))]
    )
    assert r.bad == [] and r.batch is not None and r.rows is None
    assert r.batch.column("id").to_pylist() == [2, 3, 4]  # record order kept across ids
    assert r.batch.column("currency").to_pylist() == ["EUR", "USD", "EUR"]  # v1 records get v2's default
    r = decoder.decode([avro_wire(i1, ORDER_V1, order(5))])  # the reader schema stays at the newest id
    assert r.batch is not None and r.batch.column("currency").to_pylist() == ["EUR"]
    assert registry.requests["GET /schemas/ids/1"] == 1 and registry.requests["GET /schemas/ids/2"] == 1


def test_avro_incompatible_id_and_unknown_id_are_bad_records(registry: RecordedSchemaRegistry) -> None:
    i2 = registry.register("orders-value", ORDER_V2)
    with pytest.raises(RuntimeError, match="incompatible with an earlier schema"):
        registry.register("orders-value", ORDER_V3)  # the registry refuses it under BACKWARD...
    registry.set_compatibility("orders-none-value", "NONE")
    i3 = registry.register("orders-none-value", ORDER_V3)  # ...and takes it where checks are off
    decoder = make_decoder(source(format="avro", schema_registry=registry.url, avro_schema=ORDER_V2))
    assert decoder is not None
    v3 = {**order(1), "amount": "1.25"}
    values = [avro_wire(i2, ORDER_V2, order(0, currency="EUR")), avro_wire(i3, ORDER_V3, v3), struct.pack(">bI", 0, 999) + b"\x02"]
    r = decoder.decode(values)  # type: ignore[arg-type]
    assert r.batch is not None and r.batch.column("id").to_pylist() == [0] and r.rows is not None
    errors = dict(r.bad)
    assert "schema id 3 cannot be read as avro_schema (incompatible schema change)" in errors[1]
    assert "unknown schema id 999" in errors[2]


def test_json_schema_ids_widen_and_conflicts_are_bad(registry: RecordedSchemaRegistry) -> None:
    i4 = registry.register("events-value", EVENT_V1, "JSON")
    i5 = registry.register("events-value", EVENT_V2, "JSON")
    registry.set_compatibility("events-none-value", "NONE")
    i6 = registry.register("events-none-value", EVENT_V3, "JSON")
    decoder = make_decoder(source(format="json", schema_registry=registry.url))
    assert decoder is not None
    r = decoder.decode([json_wire(i4, {"id": 1, "kind": "a", "score": 3, "tags": ["x"]})])
    assert r.batch is not None and r.batch.schema.field("score").type == pa.int64()
    r = decoder.decode(
        [
            json_wire(i4, {"id": 2, "kind": "b", "score": 4}),
            json_wire(i5, {"id": 3, "kind": "c", "score": 1.5, "source": "web"}),
            json_wire(i6, {"id": 4, "kind": 7}),
            json_wire(i5, {"id": 5, "kind": "d", "score": "high"}),  # does not fit its own schema
        ]
    )
    assert r.batch is not None and r.batch.to_pydict() == {
        "id": [2, 3],
        "kind": ["b", "c"],
        "score": [4.0, 1.5],
        "tags": [None, None],
        "source": [None, "web"],
    }
    errors = dict(r.bad)
    assert "schema id 6 is incompatible with the earlier ones: field 'kind' changed type from string to int64" in errors[2]
    assert 3 in errors


def test_json_schema_to_arrow() -> None:
    doc = {
        "type": "object",
        "definitions": {"money": {"type": "object", "properties": {"units": {"type": "integer"}, "cur": {"enum": ["EUR", "USD"]}}}},
        "properties": {
            "price": {"$ref": "#/definitions/money"},
            "maybe": {"oneOf": [{"type": "null"}, {"type": "number"}]},
            "n": {"type": ["integer", "number", "null"]},
            "flags": {"type": "array", "items": {"type": "boolean"}},
        },
    }
    assert json_schema_to_arrow(doc) == pa.schema(
        [
            ("price", pa.struct([("units", pa.int64()), ("cur", pa.string())])),
            ("maybe", pa.float64()),
            ("n", pa.float64()),
            ("flags", pa.list_(pa.bool_())),
        ]
    )
    with pytest.raises(UnsupportedSchemaError, match="m: an object without properties"):
        json_schema_to_arrow({"type": "object", "properties": {"m": {"type": "object"}}})
    with pytest.raises(UnsupportedSchemaError, match="mixes types"):
        json_schema_to_arrow({"type": "object", "properties": {"m": {"type": ["string", "integer"]}}})


# -- steady JSON/CSV schemas ----------------------------------------------------------------------------
def test_json_widens_int_to_double_and_null_to_any_across_batches() -> None:
    d = JsonDecoder(None)
    assert d.decode([b'{"a": 1, "b": null}']).bad == []
    r = d.decode([b'{"a": 1.5, "b": null}', b'{"a": 2, "b": {"x": 1}}'])  # the failing case of issue 14
    assert r.bad == [] and r.batch is not None
    assert r.batch.schema == pa.schema([("a", pa.float64()), ("b", pa.struct([("x", pa.int64())]))])
    assert r.batch.column("a").to_pylist() == [1.5, 2.0]
    r = d.decode([b'{"a": 3, "b": {"x": 2.5, "y": "new"}}'])  # known fields keep the wider type
    assert r.batch is not None and r.batch.schema.field("a").type == pa.float64()
    assert d.schema is not None and d.schema.field("b").type == pa.struct([("x", pa.float64()), ("y", pa.string())])


def test_json_incompatible_value_names_field_and_both_types() -> None:
    d = JsonDecoder(None)
    d.decode([b'{"a": 1, "s": {"t": 2}}'])
    r = d.decode([b'{"a": 2, "s": {"t": 3}}', b'{"a": "two", "s": {"t": 3}}', b'{"a": 4, "s": {"t": [1]}}', b'{"a": 5}'])
    assert r.batch is not None and r.batch.column("a").to_pylist() == [2, 5]
    errors = dict(r.bad)
    assert errors[1].startswith("field 'a' changed type from int64 to string")
    assert errors[2].startswith("field 's.t' changed type from int64 to list<item: int64>")


def test_csv_without_schema_widens_too() -> None:
    d = CsvDecoder(None)
    d.decode([b"1,x", b"2,y"])
    r = d.decode([b"2.5,z"])
    assert r.bad == [] and r.batch is not None and r.batch.column("f0").to_pylist() == [2.5]


def test_widen_and_align() -> None:
    old = pa.schema([("a", pa.int32()), ("l", pa.list_(pa.struct([("x", pa.null())])))])
    new = pa.schema([("l", pa.list_(pa.struct([("x", pa.string())]))), ("z", pa.bool_())])
    w = widen(old, new)
    assert w == pa.schema([("a", pa.int32()), ("l", pa.list_(pa.struct([("x", pa.string())]))), ("z", pa.bool_())])
    with pytest.raises(IncompatibleSchemaError) as info:
        widen(w, pa.schema([("l", pa.int64())]))
    assert (info.value.field, str(info.value.old), str(info.value.new)) == ("l", "list<item: struct<x: string>>", "int64")
    batch = pa.RecordBatch.from_pylist([{"l": [{}, None]}], schema=pa.schema([("l", pa.list_(pa.struct([])))]))
    assert align(batch, w).to_pylist() == [{"a": None, "l": [{"x": None}, None], "z": None}]


# -- the fetch thread -----------------------------------------------------------------------------------
def test_fetch_thread_stops_consuming_at_its_byte_budget() -> None:
    calls = 0
    value = b"x" * 1000

    def consume(n: int, timeout: float) -> list[FakeMessage]:
        nonlocal calls
        calls += 1
        return [FakeMessage("t", 0, calls * 10 + i, value) for i in range(10)]  # 10 kB per batch

    f = Fetcher(consume, split_messages, 10, max_bytes=35_000, name="test")
    f.start()
    try:
        with f._cv:  # wait for the thread to fill its budget (it cannot pass it: no consume() until a take)
            assert f._cv.wait_for(lambda: f.queued_bytes >= 35_000, timeout=30)
            assert calls == 4 and f.queued_records == 40
        first = f.take(1.0)
        assert first is not None and first.offsets.tolist() == list(range(10, 20)) and first.nbytes == 10_000
        with f._cv:
            assert f._cv.wait_for(lambda: calls == 5, timeout=30)  # one batch taken: one more fetched
    finally:
        f.stop()


def test_fetch_thread_failure_surfaces_in_the_task_thread() -> None:
    def consume(n: int, timeout: float) -> list[FakeMessage]:
        raise RuntimeError("broker exploded")

    f = Fetcher(consume, split_messages, 10, max_bytes=1000, name="test")
    f.start()
    try:
        with pytest.raises(RuntimeError, match="broker exploded"):
            for _ in range(300):
                f.take(0.1)
    finally:
        f.stop()
