"""The schema registry's wire format (Avro, JSON Schema) and plain Avro decoded in native code
(``native/src/wire.rs``): the same Arrow output, rows and bad records as the Python decoders, each judged
against fastavro or ``json`` on the same bytes; ids the native side has not been told about hand the
batch back. (End to end on a broker: ``test_formats_e2e.py`` and ``test_native_reader.py``.)"""

from __future__ import annotations

import copy
import datetime as dt
import decimal
import io
import json
import random
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from sluice.connectors.kafka import _native
from sluice.connectors.kafka.formats import Decoded, make_decoder
from sluice.connectors.kafka.formats.avro import AvroDecoder
from sluice.connectors.kafka.formats.avro_schema import AvroSchema
from sluice.connectors.kafka.formats.json import JsonSchemaDecoder
from sluice.connectors.kafka.native_reader import as_decoded
from sluice.connectors.kafka.native_wire import WireTable

from tests.connectors.kafka.registry_server import RecordedSchemaRegistry, avro_wire, json_wire
from tests.connectors.kafka.test_formats_units import (
    EVENT_V1,
    EVENT_V2,
    EVENT_V3,
    ORDER_V1,
    ORDER_V2,
    ORDER_V3,
    order,
    source,
)

pytestmark = pytest.mark.kafka

#: every Avro type sluice's Avro format maps to Arrow, and the logical types it casts
ALL_TYPES: dict[str, Any] = {
    "type": "record",
    "name": "All",
    "namespace": "t",
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
        {"name": "xs", "type": {"type": "array", "items": "long"}},
        {"name": "m", "type": {"type": "map", "values": "string"}},
        {"name": "maybe", "type": {"type": "map", "values": ["null", "long"]}},
        {"name": "again", "type": ["null", "Inner"]},
        {"name": "dec", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 3}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "tm", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "tu", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "tsu", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "lts", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
    ],
}


def record(rng: random.Random) -> dict[str, Any]:
    """A record of ALL_TYPES as fastavro writes it (logical types as their physical values)."""
    return {
        "b": rng.random() < 0.5,
        "i": rng.randint(-(2**31), 2**31 - 1),
        "l": rng.choice([0, -1, 2**63 - 1, -(2**63), rng.randint(-(10**12), 10**12)]),
        "f": rng.choice([0.5, -1.25, 3.0e10]),
        "d": rng.uniform(-1e9, 1e9),
        "s": rng.choice(["", "ascii", "ünïcödé ✓", "x" * 300]),
        "raw": bytes(rng.randrange(256) for _ in range(rng.randrange(20))),
        "e": rng.choice(["A", "B", "C"]),
        "fx": bytes(rng.randrange(256) for _ in range(4)),
        "opt": rng.choice([None, rng.randint(-5, 5)]),
        "opt2": rng.choice([None, "v"]),
        "inner": {"x": rng.randint(-100, 100), "tag": rng.choice([None, "t"])},
        "xs": [rng.randint(-9, 9) for _ in range(rng.randrange(4))],
        "m": {f"k{j}": rng.choice(["", "v"]) for j in range(rng.randrange(3))},
        "maybe": {f"k{j}": rng.choice([None, j]) for j in range(rng.randrange(3))},
        "again": rng.choice([None, {"x": 1, "tag": None}]),
        "dec": decimal.Decimal(rng.randint(-(10**11), 10**11)).scaleb(-3),
        "day": dt.date(1970, 1, 1) + dt.timedelta(days=rng.randint(0, 30_000)),
        "tm": dt.time(rng.randrange(24), rng.randrange(60), rng.randrange(60), rng.randrange(1000) * 1000),
        "tu": dt.time(rng.randrange(24), rng.randrange(60), rng.randrange(60), rng.randrange(10**6)),
        "ts": dt.datetime(2024, 5, 1, tzinfo=dt.UTC) + dt.timedelta(milliseconds=rng.randint(0, 10**11)),
        "tsu": dt.datetime(2024, 5, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=rng.randint(0, 10**14)),
        "lts": dt.datetime(2024, 5, 1) + dt.timedelta(milliseconds=rng.randint(0, 10**11)),
    }


def encode(schema: dict[str, Any], rec: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(copy.deepcopy(schema)), rec)
    return buf.getvalue()


def fastavro_rows(payloads: list[bytes | None], writer: dict[str, Any], reader: dict[str, Any] | None = None) -> dict[int, Any]:
    """Index -> the record fastavro reads (the reference); values it cannot read whole are left out."""
    w = fastavro.parse_schema(copy.deepcopy(writer))
    r = None if reader is None else fastavro.parse_schema(copy.deepcopy(reader))
    out = {}
    for i, p in enumerate(payloads):
        if p is None:
            continue
        fo = io.BytesIO(p)
        try:
            rec = fastavro.schemaless_reader(fo, w, r)
        except Exception:
            continue
        if fo.tell() == len(p):
            out[i] = rec
    return out


def arrow_rows(d: Decoded) -> dict[int, Any]:
    """Index -> row of a decoded batch, maps as dicts (as fastavro gives them)."""
    rows = [] if d.batch is None else d.batch.to_pylist()
    index = range(len(rows)) if d.rows is None else d.rows.tolist()
    maps = {f.name for f in d.batch.schema if pa.types.is_map(f.type)} if d.batch is not None else set()
    return {i: {k: dict(v) if k in maps else v for k, v in row.items()} for i, row in zip(index, rows, strict=True)}


def native(decoder: Any, framed: bool) -> tuple[Any, WireTable]:
    """A native wire decoder kept in step with the Python ``decoder`` (as the native reader keeps its
    consumer)."""
    n = _native.WireDecoder(framed)
    return n, WireTable(decoder, n.configure)


def both(py: Any, n: Any, values: list[bytes | None], limit: int | None = None) -> tuple[Decoded, Decoded]:
    """The same values decoded in Python and natively (the native one must know every id)."""
    py.max_record_bytes = limit
    got = n.decode(pa.array(values, pa.binary()), limit)
    assert got is not None, "the native side handed a batch with known ids back"
    return py.decode(values), as_decoded(got)


def assert_same(a: Decoded, b: Decoded) -> None:
    """Identical Arrow output, rows, bad records (by index) and tombstones."""
    assert (a.batch is None) == (b.batch is None)
    if a.batch is not None and b.batch is not None:
        assert a.batch.schema.equals(b.batch.schema), (a.batch.schema, b.batch.schema)
        assert a.batch.equals(b.batch)
    assert (None if a.rows is None else a.rows.tolist()) == (None if b.rows is None else b.rows.tolist())
    assert [i for i, _ in a.bad] == [i for i, _ in b.bad] and all(e for _, e in b.bad)
    assert a.tombstones == b.tombstones


def test_plain_avro_of_every_type_matches_fastavro_and_the_python_decoder() -> None:
    py = make_decoder(source(format="avro", avro_schema=ALL_TYPES))
    assert isinstance(py, AvroDecoder)
    n, table = native(py, framed=False)
    table.update()
    assert table.refused == {}, "arrow-avro reads every type of ALL_TYPES as sluice's Avro format does"
    rng = random.Random(3)
    good = [encode(ALL_TYPES, record(rng)) for _ in range(300)]
    wrong_enum = dict(ALL_TYPES, fields=[f if f["name"] != "e" else {**f, "type": {"type": "enum", "name": "E", "symbols": ["A", "B", "C", "D"]}} for f in ALL_TYPES["fields"]])  # fmt: skip
    not_utf8 = dict(ALL_TYPES, fields=[f if f["name"] != "s" else {**f, "type": "bytes"} for f in ALL_TYPES["fields"]])
    wrong_branch = dict(ALL_TYPES, fields=[f if f["name"] != "opt" else {**f, "type": ["null", "long", "string"]} for f in ALL_TYPES["fields"]])  # fmt: skip
    malformed = [
        good[0][:-1],  # truncated
        good[1] + b"\x00",  # a byte left after the record
        b"",
        encode(wrong_enum, {**record(rng), "e": "D"}),  # enum index 3 of 3 symbols
        encode(not_utf8, {**record(rng), "s": b"\xff\xfe"}),  # a string that is not UTF-8
        # union branch 2 of 2: an empty string, which arrow-avro alone would read as the long 0
        encode(wrong_branch, {**record(rng), "opt": ""}),
        good[2] + b"x" * 1000,  # over max_record_bytes
        None,  # a tombstone
    ]
    values: list[bytes | None] = [*good[:150], *malformed, *good[150:]]
    python, nat = both(py, n, values, limit=1000)
    assert_same(python, nat)
    reference = fastavro_rows([v if v is None or len(v) <= 1000 else None for v in values], ALL_TYPES)
    assert arrow_rows(nat) == reference
    assert sorted(i for i, _ in nat.bad) == [i for i, v in enumerate(values) if v is not None and i not in reference]
    assert nat.tombstones == 1 and len(reference) == 300
    errors = dict(nat.bad)
    assert "1 byte(s) left after the record: not written with avro_schema?" in errors[151]
    assert "enum index 3 of 3 symbols" in errors[153] and "union branch index 2" in errors[155]
    assert "over max_record_bytes (1000)" in errors[156]
    # a batch without bad records: one row per value, in order
    python, nat = both(py, n, good[:50])
    assert_same(python, nat)
    assert nat.rows is None and arrow_rows(nat) == fastavro_rows(list(good[:50]), ALL_TYPES)


def test_registry_avro_resolves_old_ids_to_the_newest_like_fastavro(registry: RecordedSchemaRegistry) -> None:
    i1 = registry.register("orders-value", ORDER_V1)
    i2 = registry.register("orders-value", ORDER_V2)
    py = make_decoder(source(format="avro", schema_registry=registry.url))
    assert isinstance(py, AvroDecoder)
    n, table = native(py, framed=True)
    first = [avro_wire(i1, ORDER_V1, order(0)), avro_wire(i2, ORDER_V2, order(1, currency="USD"))]
    assert n.decode(pa.array(first, pa.binary())) is None, "no ids known yet: Python decodes the batch"
    py.decode(first)
    table.update()
    assert table.refused == {}
    v1 = [avro_wire(i1, ORDER_V1, order(i)) for i in range(2, 40)]
    v2 = [avro_wire(i2, ORDER_V2, order(i, currency="GBP")) for i in range(40, 60)]
    values: list[bytes | None] = [
        *v1[:20], *v2[:10], v1[20][:-2], b'{"json": 1}', b"\x00\x00\x00", v2[10] + b"\x01", *v1[21:], *v2[11:],
    ]  # fmt: skip
    python, nat = both(py, n, values)
    assert_same(python, nat)
    ref: dict[int, Any] = {}
    for i, v in enumerate(values):
        assert v is not None
        sid = int.from_bytes(v[1:5], "big") if len(v) >= 5 and v[0] == 0 else None
        if sid in (i1, i2):
            got = fastavro_rows([v[5:]], ORDER_V1 if sid == i1 else ORDER_V2, ORDER_V2)
            if got:
                ref[i] = got[0]
    assert arrow_rows(nat) == ref and len(ref) == len(values) - 4
    assert all(r["currency"] == "EUR" for i, r in ref.items() if i < 20)  # v1 records take v2's default
    assert [i for i, _ in nat.bad] == [30, 31, 32, 33]
    assert "not in the Confluent wire format" in dict(nat.bad)[31]
    # an id the native side was not told about hands the batch back, whole
    assert n.decode(pa.array([*v1[:3], b"\x00\x00\x00\x03\xe7\x02"], pa.binary())) is None


def test_an_avro_id_the_native_side_cannot_resolve_is_refused_and_decodes_in_python(
    registry: RecordedSchemaRegistry,
) -> None:
    registry.set_compatibility("orders-none-value", "NONE")
    i3 = registry.register("orders-none-value", ORDER_V3)  # amount: a string, where ORDER_V2 has a double
    py = make_decoder(source(format="avro", schema_registry=registry.url, avro_schema=ORDER_V2))
    assert isinstance(py, AvroDecoder)
    n, table = native(py, framed=True)
    first = [avro_wire(i3, ORDER_V3, {**order(0), "amount": "1.5"})]
    py.decode(first)
    table.update()
    assert set(table.refused) == {i3}
    assert n.decode(pa.array(first, pa.binary())) is None  # Python decodes it, with fastavro's error


def json_rows(values: list[bytes | None], fields: dict[str, type | tuple[type, ...]]) -> dict[int, Any]:
    """Index -> the row plain ``json`` makes of a wire-format value (None fields absent), if its fields
    have the JSON types ``fields`` allows."""
    out = {}
    for i, v in enumerate(values):
        if v is None or len(v) < 5 or v[0] != 0:
            continue
        try:
            obj = json.loads(v[5:])
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        row = {k: obj.get(k) for k in fields}
        if all(x is None or (isinstance(x, fields[k]) and not isinstance(x, bool)) for k, x in row.items()):
            out[i] = row
    return out


def test_json_schema_ids_widen_like_python_and_read_like_json(registry: RecordedSchemaRegistry) -> None:
    i4 = registry.register("events-value", EVENT_V1, "JSON")
    i5 = registry.register("events-value", EVENT_V2, "JSON")
    registry.set_compatibility("events-none-value", "NONE")
    i6 = registry.register("events-none-value", EVENT_V3, "JSON")
    py = make_decoder(source(format="json", schema_registry=registry.url))
    assert isinstance(py, JsonSchemaDecoder)
    n, table = native(py, framed=True)
    py.decode([json_wire(i4, {"id": 0, "kind": "k"}), json_wire(i5, {"id": 1, "kind": "k"}), json_wire(i6, {"id": 2, "kind": 3})])
    table.update()
    values: list[bytes | None] = []
    for i in range(60):
        values.append(json_wire(i4, {"id": i, "kind": "k", "score": i, "tags": ["a", str(i)]}))
        values.append(json_wire(i5, {"id": 100 + i, "kind": "k", "score": i + 0.5, "source": "s" if i % 2 else None}))
    values[7:7] = [
        json_wire(i6, {"id": 7, "kind": 1}),  # an id incompatible with the stream: bad
        json_wire(i4, {"id": "x", "kind": "k"}),  # a string for an integer
        json_wire(i4, {"id": 1.5, "kind": "k"}),
        json_wire(i5, [1, 2]),  # not an object
        b"\x00" + i5.to_bytes(4, "big") + b"{oops",
        b'{"id": 1}',  # no header
        None,
    ]
    python, nat = both(py, n, values)
    assert_same(python, nat)
    assert nat.batch is not None and nat.batch.schema.names == ["id", "kind", "score", "tags", "source"]
    ref = json_rows(values, {"id": int, "kind": str, "score": (int, float), "tags": list, "source": str})
    got = arrow_rows(nat)
    assert {i: {k: r[k] for k in ("id", "kind", "tags", "source")} for i, r in got.items()} == {
        i: {k: r[k] for k in ("id", "kind", "tags", "source")} for i, r in ref.items()
    }
    assert all(got[i]["score"] == ref[i]["score"] for i in ref)
    assert [i for i, _ in nat.bad] == [7, 8, 9, 10, 11, 12]
    assert "incompatible with the earlier ones" in dict(nat.bad)[7] and nat.tombstones == 1


def test_avro_promotions_defaults_and_dropped_fields_resolve_like_fastavro() -> None:
    """Avro's resolution rules between a writer and a reader schema (as the registry's ids evolve): the
    native table entry a WireTable makes for an old id, judged against fastavro with the same pair."""
    writer = {
        "type": "record", "name": "R", "fields": [
            {"name": "a", "type": "int"}, {"name": "b", "type": "float"}, {"name": "c", "type": "string"},
            {"name": "d", "type": "bytes"}, {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}},
            {"name": "gone", "type": {"type": "array", "items": "string"}}, {"name": "n", "type": ["null", "int"]},
        ],
    }  # fmt: skip
    reader = {
        "type": "record", "name": "R", "fields": [
            {"name": "a", "type": "long"}, {"name": "b", "type": "double"}, {"name": "c", "type": "bytes"},
            {"name": "d", "type": "string"}, {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]}},
            {"name": "n", "type": ["null", "long"]}, {"name": "f", "type": "long", "default": 7},
            {"name": "g", "type": ["null", "string"], "default": None},
        ],
    }  # fmt: skip
    w, r = AvroSchema(writer, 1), AvroSchema(reader, 2)
    n = _native.WireDecoder(True)
    assert n.configure(r.logical, [], [(1, w.text, r.text, w.label)], []) == []
    rng = random.Random(5)
    records = [
        {"a": rng.randint(-(2**31), 2**31 - 1), "b": 0.5 * i, "c": f"c{i}", "d": b"d%d" % i, "e": "AB"[i % 2],
         "gone": ["x"] * (i % 3), "n": None if i % 2 else i}
        for i in range(40)
    ]  # fmt: skip
    values = [b"\x00\x00\x00\x00\x01" + encode(writer, rec) for rec in records]
    got = n.decode(pa.array(values, pa.binary()))
    assert got is not None
    d = as_decoded(got)
    assert d.bad == [] and d.batch is not None and d.batch.schema.equals(r.logical)
    assert arrow_rows(d) == fastavro_rows([v[5:] for v in values], writer, reader)
