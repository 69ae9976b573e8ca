"""The ``sluice`` command: new, run, checkpoints list/show (the demo: tests/cli/test_demo.py)."""

from __future__ import annotations

import json
import os
import runpy

import pytest
from click.testing import CliRunner
from sluice import CheckpointConfig, NoRestart, Pipeline
from sluice.cli import main
from sluice.cli.scaffold import available_templates
from sluice.connectors.generator import GeneratorSource
from sluice.sinks.testing import TwoPhaseCommitTestSink


def invoke(*args: str) -> str:
    r = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return r.output


def test_templates_scaffold_jobs_that_build_and_run(tmp_path, monkeypatch) -> None:
    assert {"kafka-to-parquet", "generator-to-parquet", "source", "sink"} <= set(available_templates())
    monkeypatch.chdir(tmp_path)
    invoke("new", "orders-job")  # kafka template: builds without a broker
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "broker-a:9093,broker-b:9093")
    ns = runpy.run_path(str(tmp_path / "orders_job.py"), run_name="check")
    ns["pipeline"].build()
    invoke("new", "gen-job", "--template", "generator-to-parquet")
    out = invoke("run", "gen_job.py", "--runtime", "local")
    assert "finished after 1 attempt(s)" in out
    assert any(n.endswith(".parquet") for n in os.listdir(tmp_path / "output" / "gen-job" / "totals"))
    listing = invoke("checkpoints", "list", "./checkpoints")
    assert "completed" in listing and "gen-job" in listing
    shown = invoke("checkpoints", "show", "./checkpoints", "1", "--job", "gen-job")
    assert " aligned " in shown and "unaligned*" not in shown and "(*" not in shown, shown  # no footnote for no mark
    stats = tmp_path / "checkpoints" / "gen-job" / "_stats" / "0000000000.jsonl"  # the first stats segment
    rows = [json.loads(line) for line in stats.read_text().splitlines()]
    for t in rows[0]["tasks"].values():  # as an adaptive checkpoint that switched records it
        t.update(unaligned=True, switched=True)
    stats.write_text("".join(json.dumps(r) + "\n" for r in rows))
    shown = invoke("checkpoints", "show", "./checkpoints", str(rows[0]["checkpoint_id"]), "--job", "gen-job")
    assert "unaligned*" in shown and "(* switched from aligned to unaligned after" in shown, shown
    r = CliRunner().invoke(main, ["new", "gen-job", "--template", "generator-to-parquet"])
    assert r.exit_code == 1 and "exists" in r.output
    r = CliRunner().invoke(main, ["new", "x", "--template", "nope"])
    assert r.exit_code == 1 and "allowed: debezium-to-delta, debezium-to-iceberg, generator-to-parquet, kafka-to-delta, kafka-to-iceberg, kafka-to-kafka, kafka-to-parquet, kafka-to-postgres, kafka-windowed-aggregation, sink, source" in r.output


def test_new_lists_job_and_plugin_templates() -> None:
    out = invoke("new", "--list")
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert set(lines) == set(available_templates())
    assert " job " in lines["kafka-to-parquet"] and "Kafka (JSON) -> Parquet" in lines["kafka-to-parquet"]
    assert " plugin " in lines["source"] and "sluice.connectors entry point" in lines["source"]
    assert " plugin " in lines["sink"] and "sluice.sinks entry point" in lines["sink"]
    # one column for the kinds, whatever a name's length (kafka-windowed-aggregation ran into it)
    assert len({line.index(" job ") if " job " in line else line.index(" plugin ") for line in lines.values()}) == 1, out
    r = CliRunner().invoke(main, ["new"])
    assert r.exit_code != 0 and "give a NAME" in r.output


def test_kafka_job_reads_its_connection_settings_from_the_environment(tmp_path, monkeypatch) -> None:
    invoke("new", "env-job", "--dir", str(tmp_path))
    text = (tmp_path / "env_job.py").read_text()
    assert "localhost:9092" not in text.split('"""', 2)[2], "no connection constant in the code"
    for var in ("KAFKA_BOOTSTRAP_SERVERS", "KAFKA_TOPIC", "KAFKA_SECURITY_PROTOCOL", "OUTPUT_PATH"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(SystemExit, match="set the environment variable KAFKA_BOOTSTRAP_SERVERS"):
        runpy.run_path(str(tmp_path / "env_job.py"), run_name="check")
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "kafka-1:9092")
    monkeypatch.setenv("KAFKA_TOPIC", "orders")
    monkeypatch.setenv("KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("KAFKA_SASL_MECHANISM", "PLAIN")
    monkeypatch.setenv("KAFKA_SASL_USERNAME", "user")
    monkeypatch.setenv("KAFKA_SASL_PASSWORD", "s3cret")
    monkeypatch.setenv("OUTPUT_PATH", str(tmp_path / "out"))
    monkeypatch.setenv("CHECKPOINT_PATH", str(tmp_path / "chk"))
    ns = runpy.run_path(str(tmp_path / "env_job.py"), run_name="check")
    specs = [n.spec for n in ns["pipeline"].build().logical.nodes.values()]
    (kafka,) = [s for s in specs if type(s).__name__ == "KafkaSource"]
    assert (kafka.bootstrap_servers, kafka.topics) == ("kafka-1:9092", ["orders"])
    assert kafka.consumer_config["security.protocol"] == "SASL_SSL" and "s3cret" not in repr(kafka)
    paths = sorted(s.path for s in specs if type(s).__name__ == "FileSink")
    assert paths == [str(tmp_path / "out" / "dead-letters"), str(tmp_path / "out" / "events")]


@pytest.mark.kafka
@pytest.mark.parametrize("template", ["kafka-to-parquet", "kafka-to-delta", "kafka-to-iceberg"])
def test_table_templates_run_against_kafka(template: str, apache_kafka, kafka_topic, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The templates as users run them, on Apache Kafka: ``KAFKA_STOPPING_OFFSETS=latest`` with the input
    produced in one batch (tansu under-reported that end), a malformed record to the dead letters."""
    import json

    import pyarrow.dataset

    t = kafka_topic(1)
    events = [{"id": i, "kind": "ab"[i % 2], "amount": -1.0 if i == 7 else float(i), "ts": 1_700_000_000_000 + i} for i in range(40)]
    apache_kafka.produce(t, [json.dumps(e).encode() for e in events] + [b"{not json"], partition=0)
    monkeypatch.chdir(tmp_path)
    for k, v in {"KAFKA_BOOTSTRAP_SERVERS": apache_kafka.bootstrap, "KAFKA_TOPIC": t, "KAFKA_STOPPING_OFFSETS": "latest"}.items():
        monkeypatch.setenv(k, v)
    invoke("new", "lake-job", "--template", template)
    out = invoke("run", "lake_job.py", "--runtime", "local")
    assert "finished after 1 attempt(s)" in out
    if template == "kafka-to-parquet":
        rows = pyarrow.dataset.dataset(str(tmp_path / "output" / "lake-job" / "events"), format="parquet").to_table()
        dead = pyarrow.dataset.dataset(str(tmp_path / "output" / "lake-job" / "dead-letters"), format="json").to_table()
        assert sorted(rows.column("id").to_pylist()) == [i for i in range(40) if i != 7]
        assert dead.num_rows == 1 and dead.column("offset").to_pylist() == [40]
        return
    if template == "kafka-to-delta":
        from deltalake import DeltaTable

        rows = DeltaTable(str(tmp_path / "tables" / "events")).to_pyarrow_table()
    else:
        from pyiceberg.catalog.sql import SqlCatalog

        catalog = SqlCatalog("sluice", uri=f"sqlite:///{tmp_path}/warehouse/catalog.db", warehouse=f"file://{tmp_path}/warehouse")
        rows = catalog.load_table("analytics.events").scan().to_arrow()
    assert sorted(rows.column("id").to_pylist()) == [i for i in range(40) if i != 7]
    dead = pyarrow.dataset.dataset(str(tmp_path / "dead-letters" / "lake-job"), format="json").to_table()
    assert dead.num_rows == 1 and dead.column("offset").to_pylist() == [40]


@pytest.mark.kafka
@pytest.mark.parametrize("template", ["kafka-to-kafka", "kafka-to-postgres"])
def test_sink_templates_run_against_kafka_and_postgres(template: str, apache_kafka, kafka_topic, postgres, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import json

    from tests.kafka_test_broker import read_committed

    t, out = kafka_topic(1), kafka_topic(2)
    events = [{"id": i % 25, "kind": "ab"[i % 2], "amount": -1.0 if i == 7 else float(i), "ts": 1_700_000_000_000 + i} for i in range(30)]
    apache_kafka.produce(t, [json.dumps(e).encode() for e in events], partition=0)  # one batch
    monkeypatch.chdir(tmp_path)
    conninfo = postgres.new_database()
    env = {"KAFKA_BOOTSTRAP_SERVERS": apache_kafka.bootstrap, "KAFKA_TOPIC": t, "KAFKA_STOPPING_OFFSETS": "latest",
           "OUTPUT_TOPIC": out, "POSTGRES_CONNINFO": conninfo}  # fmt: skip
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    invoke("new", "sink-job", "--template", template)
    out_text = invoke("run", "sink_job.py", "--runtime", "local")
    assert "finished after 1 attempt(s)" in out_text
    valid = [i for i in range(30) if i != 7]
    if template == "kafka-to-kafka":
        records = read_committed(apache_kafka.bootstrap, out)  # a plain read_committed consumer: once each
        assert sorted(json.loads(r.value)["amount"] for r in records) == [float(i) for i in valid]  # type: ignore[arg-type]
        assert all(r.key == json.loads(r.value)["kind"].encode() for r in records)  # type: ignore[arg-type]
    else:  # upsert by id: ids 0..4 came twice, the later event wins
        rows = postgres.query("SELECT id, amount FROM events ORDER BY id", conninfo=conninfo)
        assert rows == [(i, float(i + 25 if i < 5 else i)) for i in range(25) if i != 7]
        assert "pg-test-secret" not in out_text


def test_run_rejects_files_without_a_pipeline(tmp_path) -> None:
    job = tmp_path / "empty.py"
    job.write_text("x = 1\n")
    r = CliRunner().invoke(main, ["run", str(job), "--runtime", "local"])
    assert r.exit_code != 0 and "defines no pipeline" in r.output


def test_checkpoints_list_and_show_failed_with_reason(tmp_path) -> None:
    import time

    def slow(b):  # type: ignore[no-untyped-def]
        time.sleep(0.05)
        return b

    p = Pipeline("failing", checkpoint=CheckpointConfig(interval=0.02, timeout=0.03, storage=f"{tmp_path}/chk"),
                 restart=NoRestart())
    p.source(GeneratorSource(num_splits=1, records_per_split=10**6, batch_size=5)).rebalance(parallelism=2).map_batches(
        slow).sink(TwoPhaseCommitTestSink(f"{tmp_path}/out"))
    with pytest.raises(Exception, match="checkpoint"):
        p.run(runtime="local", restore="none")
    listing = invoke("checkpoints", "list", f"{tmp_path}/chk")
    assert "failed" in listing and "EXPIRED: no acknowledgement from" in listing
    shown = invoke("checkpoints", "show", f"{tmp_path}/chk", "1", "--job", "failing")
    assert "failure: EXPIRED" in shown
    as_json = invoke("checkpoints", "list", f"{tmp_path}/chk", "--json")
    assert '"failure_reason": "EXPIRED"' in as_json


def test_version() -> None:
    from importlib.metadata import version

    import sluice

    assert invoke("--version") == f"sluice {version('sluice-etl')}\n" == f"sluice {sluice.__version__}\n"


def test_a_duration_flag_refused_names_what_was_typed() -> None:
    for args, typed in ((["savepoint", "--timeout", "0"], "'0'"), (["stop", "--timeout", "-5"], "'-5'")):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 2, r.output
        assert f"'--timeout': must be a duration > 0 (got {typed})" in r.output, r.output
    r = CliRunner().invoke(main, ["stop", "--timeout", "0s"])
    assert "(got '0s')" in r.output, r.output


def test_job_templates_scaffolded_side_by_side_write_to_their_own_outputs(tmp_path, monkeypatch) -> None:
    """Before: every template's default output was ``./output`` or ``./dead-letters``, so two templates tried
    in one folder (the generator's and the windowed job's ``totals``) wrote into the same folders."""
    monkeypatch.chdir(tmp_path)
    for var in ("OUTPUT_PATH", "DEAD_LETTER_PATH", "TABLE_PATH", "ICEBERG_TABLE", "ICEBERG_WAREHOUSE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "kafka-1:9092")
    monkeypatch.setenv("POSTGRES_CONNINFO", "host=db dbname=analytics")
    owner: dict[str, str] = {}
    for template in (t for t in available_templates() if t not in ("source", "sink")):
        module = f"t_{template.replace('-', '_')}"
        invoke("new", module, "--template", template)
        ns = runpy.run_path(str(tmp_path / f"{module}.py"), run_name="check")
        for node in ns["pipeline"].build().logical.nodes.values():
            spec = node.spec
            where = getattr(spec, "path", None) or getattr(spec, "table", None)
            if type(spec).__name__ in ("FileSink", "DeltaSink", "IcebergSink") and where:
                place = os.path.normpath(str(where))
                assert place not in owner, f"{template} and {owner.get(place)} both write {place}"
                owner[place] = template
    assert len(owner) >= 12, owner
