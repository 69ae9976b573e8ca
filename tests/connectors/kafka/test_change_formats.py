"""The change formats (debezium-json/-avro, upsert-json/-avro) decoding message batches into change batches:
every op, the Connect schema envelope or none, tombstones, keys, bad records, options; Avro through the
recorded schema registry."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest
from sluice.changes import OP, ORDER, Op, keys_of
from sluice.connectors.kafka import KafkaSource
from sluice.connectors.kafka.formats import FORMATS, Decoded, Messages, make_decoder
from sluice.errors import ConfigError

from tests.connectors.kafka.change_events import (
    DBZ_ENVELOPE,
    DBZ_KEY,
    USER,
    USER_KEY,
    connect_json,
    event,
    json_key,
)
from tests.connectors.kafka.fakes import FakeMessage
from tests.connectors.kafka.registry_server import RecordedSchemaRegistry, avro_wire

C, U, D, R = (int(o) for o in (Op.INSERT, Op.UPDATE, Op.DELETE, Op.READ))


def decode(pairs: list[tuple[bytes | None, bytes | None]], first_offset: int = 100, **options: Any) -> Decoded:
    """Decode ``(key, value)`` messages (offsets from ``first_offset``) with a fresh decoder."""
    src = KafkaSource("localhost:9092", "t", **options)
    src.validate()
    msgs = [FakeMessage("t", 0, first_offset + i, v, k=k) for i, (k, v) in enumerate(pairs)]
    return make_decoder(src.options).decode_messages(Messages.of(msgs))


def dbz(op: str, before: dict[str, Any] | None, after: dict[str, Any] | None, *, schema: bool = False) -> bytes:
    e = event(op, before, after)
    return connect_json(e) if schema else json.dumps(e).encode()


def rows(d: Decoded, *columns: str) -> list[tuple[Any, ...]]:
    assert d.batch is not None
    return list(zip(*(d.batch.column(c).to_pylist() for c in columns), strict=True))


A1, A2, B1 = {"id": 1, "name": "ann", "email": None}, {"id": 1, "name": "anna", "email": "a@x"}, {"id": 2, "name": "bob", "email": None}


def test_registered_names() -> None:
    assert {"debezium-json", "debezium-avro", "upsert-json", "upsert-avro"} <= set(FORMATS)


def test_debezium_json_every_op_with_and_without_the_schema_envelope() -> None:
    d = decode(
        [
            (json_key(2), dbz("r", None, B1)),
            (json_key(1, schema=True), dbz("c", None, A1, schema=True)),
            (json_key(1), dbz("u", A1, A2)),
            (json_key(1, schema=True), dbz("d", A2, None, schema=True)),
        ],
        format="debezium-json",
    )
    assert d.batch is not None and d.rows is None and d.bad == [] and d.tombstones == 0
    assert d.batch.schema.names == ["id", "name", "email", OP, ORDER]
    assert keys_of(d.batch.schema) == ("id",)
    assert d.batch.schema.field(OP).type == pa.int8() and d.batch.schema.field(ORDER).type == pa.int64()
    assert rows(d, "id", "name", "email", OP, ORDER) == [
        (2, "bob", None, R, 100),
        (1, "ann", None, C, 101),
        (1, "anna", "a@x", U, 102),
        (1, "anna", "a@x", D, 103),  # a delete's row is its before
    ]


def test_tombstones_delete_the_key_or_are_skipped() -> None:
    pairs = [(json_key(1), dbz("d", A1, None)), (json_key(1), None), (json_key(2, schema=True), None)]
    d = decode(pairs, format="debezium-json")
    assert rows(d, "id", "name", OP, ORDER) == [(1, "ann", D, 100), (1, None, D, 101), (2, None, D, 102)]
    assert d.tombstones == 0
    skip = decode(pairs, format="debezium-json", format_options={"tombstones": "skip"})
    assert rows(skip, "id", OP, ORDER) == [(1, D, 100)] and skip.tombstones == 2
    assert list(skip.rows) == [0]  # type: ignore[arg-type]


def test_key_columns_from_the_rows_and_tombstones_from_their_keys() -> None:
    d = decode(
        [(None, dbz("c", None, A1)), (None, dbz("d", B1, None)), (json_key(1), None), (b'{"other": 3}', None)],
        format="debezium-json",
        format_options={"key_columns": ["id"]},
    )
    assert keys_of(d.batch.schema) == ("id",)  # type: ignore[union-attr]
    assert rows(d, "id", "name", OP) == [(1, "ann", C), (2, "bob", D), (1, None, D)]
    assert d.bad == [(3, "key column 'id' is null (a change needs its whole key)")]


def test_null_keys_and_malformed_records_are_bad_records_the_rest_decodes() -> None:
    d = decode(
        [
            (json_key(1), dbz("c", None, A1)),
            (None, dbz("c", None, B1)),  # no message key
            (json_key(3), b'{"op": "c", "after": {"id": 3'),  # truncated value
            (b"{not json", dbz("c", None, B1)),  # malformed key
            (json_key(4), dbz("t", None, None)),  # a truncate: no key change
            (json_key(5), dbz("u", A1, None)),  # an update without its row
            (b'{"id": null}', dbz("c", None, A1)),
            (None, None),  # a tombstone without a key deletes nothing
            (json_key(2), dbz("c", None, B1)),
        ],
        format="debezium-json",
    )
    assert rows(d, "id", ORDER) == [(1, 100), (2, 108)]
    assert list(d.rows) == [0, 8]  # type: ignore[arg-type]
    errors = dict(d.bad)
    assert sorted(errors) == [1, 2, 3, 4, 5, 6, 7]
    assert errors[1] == errors[7] == "a change needs a message key (the row's key) and this record has none"
    assert errors[2].startswith("ArrowInvalid: JSON parse error")
    assert errors[3].startswith("message key: ArrowInvalid: JSON parse error")
    assert errors[4] == "op must be one of 'c', 'u', 'd', 'r' (got 't')"
    assert errors[5] == "a change with op 'u' needs an 'after' row"
    assert errors[6] == "key column 'id' is null (a change needs its whole key)"


def test_source_fields_ts_ms_and_a_given_row_schema() -> None:
    row = pa.schema([("id", pa.int32()), ("name", pa.string())])
    d = decode(
        [(json_key(1), dbz("c", None, A1)), (json_key(1), None)],
        format="debezium-json",
        schema=row,
        format_options={"source_fields": ["table", "lsn"], "ts_ms": True},
    )
    assert d.batch is not None
    assert d.batch.schema.names == ["id", "name", "_source_table", "_source_lsn", "_ts_ms", OP, ORDER]
    assert d.batch.schema.field("name").type == pa.string() and d.batch.schema.field("_ts_ms").type == pa.timestamp("ms", tz="UTC")
    assert rows(d, "name", "_source_table", "_source_lsn", OP) == [("ann", "customers", 0, C), (None, None, None, D)]
    assert d.batch.column("_ts_ms")[0].value == 1_700_000_000_000


def test_debezium_avro_through_the_registry(registry: RecordedSchemaRegistry) -> None:
    kid = registry.register("dbserver1.inventory.customers-key", DBZ_KEY)
    vid = registry.register("dbserver1.inventory.customers-value", DBZ_ENVELOPE)

    def key(i: int) -> bytes:
        return avro_wire(kid, DBZ_KEY, {"id": i})

    def value(op: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> bytes:
        return avro_wire(vid, DBZ_ENVELOPE, event(op, before, after, lsn=7))

    d = decode(
        [
            (key(2), value("r", None, B1)),
            (key(1), value("c", None, A1)),
            (key(1), value("u", A1, A2)),
            (key(1), value("d", A2, None)),
            (key(1), None),
            (key(2), b"\x00\x00\x00\x00\x0c\x02"),  # id 12, truncated
            (None, value("c", None, A1)),
        ],
        format="debezium-avro",
        schema_registry=registry.url,
        format_options={"source_fields": ["lsn"]},
    )
    assert d.batch is not None and keys_of(d.batch.schema) == ("id",)
    assert d.batch.schema.names == ["id", "name", "email", "_source_lsn", OP, ORDER]
    assert rows(d, "id", "name", "email", "_source_lsn", OP) == [
        (2, "bob", None, 7, R),
        (1, "ann", None, 7, C),
        (1, "anna", "a@x", 7, U),
        (1, "anna", "a@x", 7, D),
        (1, None, None, None, D),
    ]
    assert [i for i, _ in d.bad] == [5, 6] and "needs a message key" in d.bad[1][1]


def test_upsert_json_object_scalar_and_string_keys() -> None:
    obj = decode(
        [(b'{"user_id": 7}', b'{"name": "a", "score": 1}'), (b'{"user_id": 7}', None), (None, b'{"name": "x"}')],
        format="upsert-json",
    )
    assert keys_of(obj.batch.schema) == ("user_id",)  # type: ignore[union-attr]
    assert rows(obj, "user_id", "name", "score", OP, ORDER) == [(7, "a", 1, U, 100), (7, None, None, D, 101)]
    assert obj.bad == [(2, "a change needs a message key (the row's key) and this record has none")]
    scalar = decode(
        [(b"7", b'{"name": "a"}'), (b"8", None)],
        format="upsert-json",
        format_options={"key_column": "user_id"},
    )
    assert rows(scalar, "user_id", "name", OP) == [(7, "a", U), (8, None, D)]
    text = decode(
        [(b"user-7", b'{"name": "a"}'), (b"\xff\xfe", b'{"name": "b"}'), (b"user-7", None)],
        format="upsert-json",
        format_options={"key_column": "user", "key_format": "string"},
    )
    assert rows(text, "user", "name", OP) == [("user-7", "a", U), ("user-7", None, D)]
    assert [i for i, _ in text.bad] == [1] and "not UTF-8" in text.bad[0][1]


def test_upsert_avro_record_and_primitive_keys(registry: RecordedSchemaRegistry) -> None:
    kid = registry.register("users-key", USER_KEY)
    vid = registry.register("users-value", USER)
    lid = registry.register("user-ids-key", "long")  # type: ignore[arg-type]
    user = avro_wire(vid, USER, {"name": "a", "score": 2.5})
    d = decode(
        [(avro_wire(kid, USER_KEY, {"user_id": 3}), user), (avro_wire(kid, USER_KEY, {"user_id": 3}), None)],
        format="upsert-avro",
        schema_registry=registry.url,
    )
    assert keys_of(d.batch.schema) == ("user_id",)  # type: ignore[union-attr]
    assert rows(d, "user_id", "name", "score", OP) == [(3, "a", 2.5, U), (3, None, None, D)]
    prim = decode(
        [(avro_wire(lid, "long", 9), user)],  # type: ignore[arg-type]
        format="upsert-avro",
        schema_registry=registry.url,
        format_options={"key_column": "user_id"},
    )
    assert rows(prim, "user_id", "name", OP) == [(9, "a", U)]
    text = decode(
        [(b"u9", user)], format="upsert-avro", schema_registry=registry.url,
        format_options={"key_format": "string", "key_column": "k"},
    )
    assert rows(text, "k", "score") == [("u9", 2.5)]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"format": "debezium-json", "format_options": {"tombstones": "drop"}},
         r"^KafkaSource: format_options\['tombstones'\] must be 'delete' or 'skip' \(got 'drop'\)$"),
        ({"format": "debezium-json", "format_options": {"keys": ["id"]}},
         r"^KafkaSource: format_options of format 'debezium-json' are \('key_columns', 'tombstones', 'source_fields', 'ts_ms'\) \(got 'keys'\)$"),
        ({"format": "debezium-json", "format_options": {"key_columns": ["id", "id"]}},
         r"format_options\['key_columns'\] must be a column name, a list of distinct names or None"),
        ({"format": "debezium-json", "format_options": {"ts_ms": "yes"}}, r"format_options\['ts_ms'\] must be True or False"),
        ({"format": "debezium-avro"}, r"format 'debezium-avro' needs schema_registry"),
        ({"format": "upsert-avro"}, r"format 'upsert-avro' needs schema_registry"),
        ({"format": "upsert-json", "format_options": {"key_format": "xml"}},
         r"format_options\['key_format'\] must be one of \('json', 'string', 'avro'\) or None \(got 'xml'\)"),
        ({"format": "upsert-json", "format_options": {"key_format": "string"}}, r"needs format_options\['key_column'\]"),
        ({"format": "upsert-json", "format_options": {"key_format": "avro"}}, r"Avro keys of format 'upsert-json' need schema_registry"),
        ({"format": "upsert-json", "schema_registry": "http://r:8081"}, r"schema_registry of format 'upsert-json' applies to Avro keys"),
        ({"format": "json", "format_options": {"key_column": "id"}},
         r"format_options applies to format 'debezium-avro' or 'debezium-json' or 'upsert-avro' or 'upsert-json' \(got 'json'\)"),
        ({"format": "upsert-json", "format_options": ["key_column"]}, r"format_options must be a dict of the format's options or None"),
    ],
)
def test_options_are_refused_in_one_line_naming_option_and_allowed_values(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        KafkaSource("localhost:9092", "t", **options).validate()
    assert "\n" not in str(info.value)


def test_connect_envelopes_are_cut_to_their_payload_bytes() -> None:
    from sluice.connectors.kafka.formats.keys import ConnectUnwrapper

    unwrap = ConnectUnwrapper()
    v1 = b'{"schema":{"type":"struct","fields":[{"field":"a","default":0}]},"payload":{"a": 1}}'
    v2 = b'{ "schema" : {"type":"struct","fields":[{"field":"b","default":"x"}]} ,\n "payload" : {"b": "\xc3\xa9"} }\n'
    outbox = b'{"schema": "public", "payload": "{}", "op": "c"}'  # columns named schema and payload: no envelope
    plain = b'{"before": null, "source": {"schema": "public"}}'
    assert unwrap([v1, v2, v1, outbox, plain, b"{bad"]) == [b'{"a": 1}', b'{"b": "\xc3\xa9"}', b'{"a": 1}', outbox, plain, b"{bad"]


def test_the_inferred_envelope_schema_is_steady_and_adopted() -> None:
    src = KafkaSource("localhost:9092", "t", format="debezium-json")
    src.validate()
    assert src.options.infers_schema
    sampler = make_decoder(src.options)
    sampler.decode([dbz("c", None, A2)])  # type: ignore[union-attr]  # the enumerator's sample
    reader = make_decoder(src.options)
    reader.adopt(sampler.steady_schema)  # type: ignore[union-attr]
    d = reader.decode_messages(Messages.of([FakeMessage("t", 0, 0, dbz("c", None, A1), k=json_key(1))]))
    assert d.batch is not None and d.batch.schema.field("email").type == pa.string()
    assert reader.steady_schema.field("after").type.field("email").type == pa.string()  # type: ignore[union-attr]


def test_only_the_row_sides_in_use_must_agree_and_misfits_are_bad_records() -> None:
    def value(op: str, before: Any, after: Any) -> bytes:
        return json.dumps({"op": op, "before": before, "after": after}).encode()

    d = decode(
        [(json_key(1), value("u", {"x": "a"}, {"x": 1})), (json_key(2), value("c", None, {"x": 2}))],
        format="debezium-json",
    )
    assert rows(d, "id", "x") == [(1, 1), (2, 2)] and d.bad == []  # before's x is never used
    d = decode(
        [(json_key(1), value("c", None, {"x": 1})), (json_key(1), value("d", {"x": "a"}, None))],
        format="debezium-json",
    )
    assert rows(d, "id", "x") == [(1, 1)]
    assert [i for i, _ in d.bad] == [1] and "before row of a delete does not fit" in d.bad[0][1]


def test_format_options_as_a_frozen_model() -> None:
    from sluice.connectors.kafka.formats import DebeziumOptions, UpsertOptions

    d = decode([(None, dbz("c", None, A1))], format="debezium-json", format_options=DebeziumOptions(key_columns="id"))
    assert rows(d, "id", OP) == [(1, C)]
    u = decode([(b"5", b'{"n": 1}')], format="upsert-json", format_options=UpsertOptions(key_column="k"))
    assert rows(u, "k", "n") == [(5, 1)]
    with pytest.raises(ConfigError, match=r"^KafkaSource: format_options\['key_column'\] must be a column name or None \(got ''\)$"):
        UpsertOptions(key_column="")
