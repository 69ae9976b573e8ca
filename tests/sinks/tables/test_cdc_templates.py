"""``sluice new --template debezium-to-delta`` / ``debezium-to-iceberg``: the scaffolded jobs build without a
broker and, run against Apache Kafka with Debezium change events (a snapshot, then inserts, updates, deletes and
tombstones of the same keys, in JsonConverter's envelope and without it), leave the table equal to the
source table: the events applied in order to a dict."""

from __future__ import annotations

import json
import random
import runpy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.apache_kafka import ApacheKafkaBroker
from tests.cli.test_cli import invoke
from tests.connectors.kafka.change_events import connect_json, event, json_key

TEMPLATES = ["debezium-to-delta", "debezium-to-iceberg"]


@pytest.mark.parametrize("template", TEMPLATES)
def test_the_templates_build_an_upsert_job_without_a_broker(template: str, tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    invoke("new", "cdc-job", "--template", template)
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "kafka-1:9092")
    ns = runpy.run_path(str(tmp_path / "cdc_job.py"), run_name="check")
    specs = [n.spec for n in ns["pipeline"].build().logical.nodes.values()]
    (kafka,) = [s for s in specs if type(s).__name__ == "KafkaSource"]
    assert kafka.options.format == "debezium-json" and kafka.topics == ["dbserver1.inventory.customers"]
    (table,) = [s for s in specs if type(s).__name__ in ("DeltaSink", "IcebergSink")]
    assert table.mode == "upsert" and table.schema_mode == "merge" and table.key_columns == []


def change_events(rng: random.Random, partition: int, n: int) -> tuple[list[tuple[bytes, bytes | None]], dict[int, Any]]:
    """``n`` Debezium events of keys of ``partition`` (a snapshot read of each, then random changes) and the
    source table they leave."""
    keys = [partition * 100 + k for k in range(8)]
    table: dict[int, Any] = {}
    out: list[tuple[bytes, bytes | None]] = []

    def emit(i: int, op: str, row: dict[str, Any] | None) -> None:
        before = table.get(i)
        e = event(op, None if before is None else {"id": i, **before}, row, lsn=len(out))
        envelope = len(out) % 2 == 0  # every other event in the schema envelope
        out.append((json_key(i, schema=envelope), connect_json(e) if envelope else json.dumps(e).encode()))
        if op == "d":
            table.pop(i, None)
            out.append((json_key(i), None))  # the tombstone Debezium writes after a delete
        else:
            assert row is not None
            table[i] = {"name": row["name"], "email": row["email"]}

    for i in keys:
        emit(i, "r", {"id": i, "name": f"snap-{i}", "email": None})
    while len(out) < n:
        i = rng.choice(keys)
        op = "d" if i in table and rng.random() < 0.2 else ("u" if i in table else "c")
        emit(i, op, None if op == "d" else {"id": i, "name": f"n{len(out)}", "email": f"{len(out)}@x.org"})
    return out, {i: (r["name"], r["email"]) for i, r in table.items()}


@pytest.mark.kafka
@pytest.mark.parametrize("template", TEMPLATES)
def test_a_debezium_template_keeps_the_table_equal_to_the_source_table(
    template: str, apache_kafka: ApacheKafkaBroker, kafka_topic: Callable[..., str], tmp_path: Path, monkeypatch: Any
) -> None:
    t = kafka_topic(2)
    rng = random.Random(26)
    expected: dict[int, Any] = {}
    for p in (0, 1):
        events, table = change_events(rng, p, 60)
        expected.update(table)
        keys, values = zip(*events, strict=True)
        apache_kafka.produce(t, list(values), partition=p, keys=list(keys))  # batched: "latest" is the end
    monkeypatch.chdir(tmp_path)
    env = {
        "KAFKA_BOOTSTRAP_SERVERS": apache_kafka.bootstrap,
        "KAFKA_TOPIC": t,
        "KAFKA_STOPPING_OFFSETS": "latest",
        "CHECKPOINT_INTERVAL": "0.2",
        "ICEBERG_PARTITION_BY": "bucket(4, id)",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    invoke("new", "cdc-job", "--template", template)
    out = invoke("run", "cdc_job.py", "--runtime", "local")
    assert "finished after 1 attempt(s)" in out
    if template == "debezium-to-delta":
        from deltalake import DeltaTable

        rows = DeltaTable(str(tmp_path / "tables" / "customers")).to_pyarrow_table()
    else:
        from pyiceberg.catalog.sql import SqlCatalog

        catalog = SqlCatalog("sluice", uri=f"sqlite:///{tmp_path}/warehouse/catalog.db", warehouse=f"file://{tmp_path}/warehouse")
        rows = catalog.load_table("inventory.customers").scan().to_arrow()
    ids = rows.column("id").to_pylist()
    assert len(ids) == len(set(ids)), "a key is in the table twice"
    got = dict(zip(ids, zip(rows.column("name").to_pylist(), rows.column("email").to_pylist(), strict=True), strict=True))
    assert got == expected
