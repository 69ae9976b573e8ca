"""Change formats in jobs: tansu (+ the recorded schema registry) -> KafkaSource(format="debezium-*"/"upsert-*")
-> file and collect sinks; malformed records to dead letters or failing the job, named by topic, partition
and offset."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sluice.changes import OP, ORDER, Op, keys_of
from sluice.config import NoRestart
from sluice.connectors.kafka import KafkaSource
from sluice.errors import BadRecordError, JobFailedError
from sluice.sinks.files import FileSink
from sluice.sinks.testing import TwoPhaseCommitTestSink, read_committed

from tests import listing
from tests.connectors.kafka.change_events import DBZ_ENVELOPE, DBZ_KEY, connect_json, event, json_key
from tests.connectors.kafka.registry_server import RecordedSchemaRegistry, avro_wire
from tests.connectors.kafka.test_formats_e2e import pipeline, stops
from tests.kafka_broker import TansuBroker

pytestmark = [pytest.mark.kafka, pytest.mark.usefixtures("kafka_reader"), pytest.mark.tansu(
    "change-format decoding: plain records produced before the job, read to explicit stops from the fetched end (high_watermark.py); no transactions, timestamp lookups, out-of-range positions or new partitions"
)]

C, U, D, R = (int(o) for o in (Op.INSERT, Op.UPDATE, Op.DELETE, Op.READ))


def customer(i: int, name: str) -> dict[str, Any]:
    return {"id": i, "name": name, "email": f"{i}@example.org" if i >= 100 else None}


def test_debezium_json_job_writes_change_columns_and_dead_letters(
    broker: TansuBroker, topic: Callable[..., str], tmp_path: Path
) -> None:
    t = topic(2)
    expected: list[tuple[int, int, str | None, int, int]] = []  # (partition, id, name, op, offset)
    bad: set[tuple[int, int]] = set()
    for p in (0, 1):
        keys: list[bytes | None] = []
        values: list[bytes | None] = []

        def add(key: bytes | None, value: bytes | None, i: int, row: tuple[str | None, int] | None = None) -> None:
            """One message; ``row``: the (name, op) it becomes, None: a dead letter."""
            if row is None:
                bad.add((p, len(values)))  # noqa: B023 - used at once
            else:
                expected.append((p, i, row[0], row[1], len(values)))  # noqa: B023
            keys.append(key)  # noqa: B023
            values.append(value)  # noqa: B023

        for n in range(20):
            i = p * 100 + n
            env = n % 2 == 0  # every other record in JsonConverter's schema envelope

            def wrap(e: dict[str, Any], env: bool = env) -> bytes:
                return connect_json(e) if env else json.dumps(e).encode()

            add(json_key(i, schema=env), wrap(event("r" if n < 5 else "c", None, customer(i, "a"))), i, ("a", R if n < 5 else C))
            add(json_key(i), wrap(event("u", customer(i, "a"), customer(i, "b"))), i, ("b", U))
            if n % 3 == 0:
                add(json_key(i), wrap(event("d", customer(i, "b"), None)), i, ("b", D))
                add(json_key(i), None, i, (None, D))  # the tombstone after a delete: a delete of the key
            if n % 7 == 3:
                add(None, wrap(event("c", None, customer(i, "x"))), i)  # no key
                add(json_key(i), b'{"op": "c", "after": {"id": ', i)  # truncated
                add(json_key(i), wrap(event("t", None, None)), i)  # a truncate
        broker.produce(t, values, partition=p, keys=keys)
    pl = pipeline("dbz-json", tmp_path)
    stream = pl.source(
        KafkaSource(
            broker.bootstrap,
            t,
            format="debezium-json",
            format_options={"source_fields": ["table"]},
            on_bad_record="dead_letter",
            include_metadata=True,
            batch_size=16,
            stopping_offsets=stops(broker, t),
        )
    )
    stream.sink(FileSink(str(tmp_path / "out"), format="parquet"))
    stream.side_output("dead_letters").sink(TwoPhaseCommitTestSink(str(tmp_path / "dead"), name="dead"), name="dead")
    pl.run(runtime="local", restore="none")
    files = [f for f in listing.file_paths(tmp_path / "out", "*.parquet") if not f.name.startswith((".", "_"))]
    out = pa.concat_tables([pq.read_table(f) for f in files], promote_options="default")
    # partition 0 has no emails: the envelope schema sampled across partitions types them in every file
    assert {pq.read_schema(f).field("email").type for f in files} == {pa.string()}
    assert out.column_names[:4] == ["id", "name", "email", "_source_table"]
    assert out.column_names[4:6] == [OP, ORDER] and keys_of(out.schema) == ("id",)
    got = sorted(
        zip(*(out.column(c).to_pylist() for c in ("_partition", "id", "name", OP, ORDER)), strict=True),
        key=lambda r: (r[0], r[4]),
    )
    assert got == sorted(expected, key=lambda r: (r[0], r[4]))
    assert out.column(ORDER).to_pylist() == out.column("_offset").to_pylist()  # the order is the offset
    assert set(out.column("_source_table").to_pylist()) == {"customers", None}  # None: tombstones
    dead = read_committed(str(tmp_path / "dead"))
    assert dead is not None
    assert sorted(zip(dead.column("partition").to_pylist(), dead.column("offset").to_pylist(), strict=True)) == sorted(bad)
    assert set(dead.column("topic").to_pylist()) == {t}
    errors = set(dead.column("error").to_pylist())
    assert any("needs a message key" in e for e in errors) and any("op must be one of" in e for e in errors)
    assert any("JSON parse error" in e for e in errors)


def test_debezium_avro_job_fails_naming_the_malformed_record(
    broker: TansuBroker, topic: Callable[..., str], registry: RecordedSchemaRegistry, tmp_path: Path
) -> None:
    t = topic(1)
    kid = registry.register("dbserver1.inventory.customers-key", DBZ_KEY)
    vid = registry.register("dbserver1.inventory.customers-value", DBZ_ENVELOPE)
    keys = [avro_wire(kid, DBZ_KEY, {"id": i}) for i in range(3)]
    values = [avro_wire(vid, DBZ_ENVELOPE, event("c", None, customer(i, "a"))) for i in range(3)]
    values[2] = values[2][:9]  # truncated
    broker.produce(t, values, partition=0, keys=keys)
    pl = pipeline("dbz-avro-fail", tmp_path, parallelism=1, restart=NoRestart())
    pl.source(
        KafkaSource(
            broker.bootstrap, t, format="debezium-avro", schema_registry=registry.url, stopping_offsets=stops(broker, t)
        )
    ).sink(TwoPhaseCommitTestSink(str(tmp_path / "out")))
    with pytest.raises(JobFailedError) as info:
        pl.run(runtime="local", restore="none")
    cause = info.value.__cause__
    assert isinstance(cause, BadRecordError) and (cause.topic, cause.partition, cause.offset) == (t, 0, 2)
    assert "cannot decode a record as debezium-avro" in str(cause)


def test_debezium_avro_and_upsert_json_jobs_emit_change_batches(
    broker: TansuBroker, topic: Callable[..., str], registry: RecordedSchemaRegistry, tmp_path: Path
) -> None:
    t = topic(1)
    kid = registry.register("dbserver1.inventory.customers-key", DBZ_KEY)
    vid = registry.register("dbserver1.inventory.customers-value", DBZ_ENVELOPE)
    changes = [("c", None, customer(1, "a")), ("u", customer(1, "a"), customer(1, "b")), ("d", customer(1, "b"), None)]
    broker.produce(
        t,
        [*(avro_wire(vid, DBZ_ENVELOPE, event(*c)) for c in changes), None],
        partition=0,
        keys=[avro_wire(kid, DBZ_KEY, {"id": 1})] * 4,
    )
    pl = pipeline("dbz-avro", tmp_path, parallelism=1)
    pl.source(
        KafkaSource(
            broker.bootstrap, t, format="debezium-avro", schema_registry=registry.url, stopping_offsets=stops(broker, t)
        )
    ).sink(TwoPhaseCommitTestSink(str(tmp_path / "out")))
    pl.run(runtime="local", restore="none")
    out = read_committed(str(tmp_path / "out"))
    assert out is not None and out.column_names == ["id", "name", "email", OP, ORDER]
    assert out.select(["id", "name", OP, ORDER]).to_pylist() == [
        {"id": 1, "name": "a", OP: C, ORDER: 0},
        {"id": 1, "name": "b", OP: U, ORDER: 1},
        {"id": 1, "name": "b", OP: D, ORDER: 2},
        {"id": 1, "name": None, OP: D, ORDER: 3},
    ]

    k = topic(1)
    broker.produce(
        k,
        [b'{"name": "a", "score": 1}', b'{"name": "b", "score": 2.5}', None, b'{"name": "c"}'],
        partition=0,
        keys=[b"7", b"8", b"7", None],
    )
    pl = pipeline("upsert-json", tmp_path / "u", parallelism=1)
    stream = pl.source(
        KafkaSource(
            broker.bootstrap,
            k,
            format="upsert-json",
            format_options={"key_column": "user_id"},
            on_bad_record="dead_letter",
            stopping_offsets=stops(broker, k),
        )
    )
    stream.sink(TwoPhaseCommitTestSink(str(tmp_path / "u-out")))
    stream.side_output("dead_letters").sink(TwoPhaseCommitTestSink(str(tmp_path / "u-dead"), name="dead"), name="dead")
    pl.run(runtime="local", restore="none")
    out = read_committed(str(tmp_path / "u-out"))
    assert out is not None and out.column_names == ["user_id", "name", "score", OP, ORDER]
    assert [tuple(r.values()) for r in out.to_pylist()] == [(7, "a", 1.0, U, 0), (8, "b", 2.5, U, 1), (7, None, None, D, 2)]
    dead = read_committed(str(tmp_path / "u-dead"))
    assert dead is not None and dead.select(["topic", "partition", "offset"]).to_pylist() == [
        {"topic": k, "partition": 0, "offset": 3}
    ]
