"""PostgresSink on a real PostgreSQL server (Debian's package, started by the ``postgres`` fixture): types,
append and upsert, a prepared transaction that survives a server crash and is committed on restore, orphans
rolled back, the server check (max_prepared_transactions = 0), schema errors naming both schemas, and no
password in any message, repr or log line."""

from __future__ import annotations

import datetime
import decimal
import itertools
import logging
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from sluice import FixedDelayRestart, Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.errors import ConfigError, JobFailedError, SluiceError
from sluice.sinks.postgres import PostgresSink
from sluice.testing.conformance import SinkTarget
from sluice.testing.conformance.sink_harness import SinkAttempt

from tests.postgres_server import PASSWORD, PostgresServer

_jobs = itertools.count()


def attempt(sink: PostgresSink, job: str, restored: Any = None, parallelism: int = 1) -> SinkAttempt:
    return SinkAttempt(SinkTarget(sink, lambda: None, lambda: []), parallelism, job, 1, restored)


def rows_of(pg: PostgresServer, conninfo: str, sql: str) -> list[tuple[Any, ...]]:
    return pg.query(sql, conninfo=conninfo)


def test_types_append_and_upsert(postgres: PostgresServer) -> None:
    db = postgres.new_database()
    batch = pa.record_batch({
        "id": pa.array([1, 2, 3], pa.int64()),
        "name": ["a", "é\"'\\\t\n", None],
        "score": [1.5, None, -2.25],
        "ok": [True, False, None],
        "at": pa.array([datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)] * 3, pa.timestamp("us", "UTC")),
        "price": pa.array([decimal.Decimal("1.25"), None, decimal.Decimal("-0.50")], pa.decimal128(6, 2)),
    })  # fmt: skip
    a = attempt(PostgresSink(db, "events"), f"j{next(_jobs)}")
    a.cycle(1, {0: [batch]}, last=True)
    a.close()
    got = rows_of(postgres, db, "SELECT id, name, score, ok, at, price FROM events ORDER BY id")
    assert got == [tuple(r.values()) for r in batch.to_pylist()]
    up = PostgresSink(db, "latest", mode="upsert", key_columns=["id"])
    a = attempt(up, f"j{next(_jobs)}")
    a.cycle(1, {0: [pa.record_batch({"id": [1, 2, 1], "v": ["x", "y", "z"]})]})
    a.cycle(2, {0: [pa.record_batch({"id": [2, 3], "v": ["Y", "w"]})]}, last=True)
    a.close()
    assert rows_of(postgres, db, "SELECT id, v FROM latest ORDER BY id") == [(1, "z"), (2, "Y"), (3, "w")]


def test_a_prepared_transaction_survives_a_server_crash_and_is_committed_on_restore(
    killable_postgres: PostgresServer,
) -> None:
    """Pre-commit prepares (durable, invisible); the server is killed before the checkpoint's commit; after
    its restart the restore commits the prepared transaction the checkpoint names, once, and rolls back the
    one of a checkpoint that never completed."""
    pg = killable_postgres
    db = pg.new_database()
    sink = PostgresSink(db, "t")
    job = f"j{next(_jobs)}"
    a = attempt(sink, job)
    a.cycle(1, {0: [pa.record_batch({"id": [0, 1]})]})
    a.write(0, pa.record_batch({"id": [2, 3]}))
    a.prepare(2)
    completed = a.snapshot(2)  # checkpoint 2 completes; the crash comes before its commit
    a.write(0, pa.record_batch({"id": [4]}))
    a.prepare(3)  # checkpoint 3 prepared, never completed
    pg.kill()
    pg.start()
    prepared = rows_of(pg, db, "SELECT count(*) FROM pg_prepared_xacts")[0][0]
    assert prepared == 2 and rows_of(pg, db, "SELECT id FROM t ORDER BY id") == [(0,), (1,)]
    again = attempt(sink, job, completed)
    assert rows_of(pg, db, "SELECT id FROM t ORDER BY id") == [(0,), (1,), (2,), (3,)]
    assert rows_of(pg, db, "SELECT count(*) FROM pg_prepared_xacts")[0][0] == 0
    again.close()
    attempt(sink, job, completed).close()  # a second restore of the same checkpoint: the marker row decides
    assert rows_of(pg, db, "SELECT id FROM t ORDER BY id") == [(0,), (1,), (2,), (3,)]
    assert sink.committed_checkpoint(job, "uid") == 2 and sink.committed_checkpoint("other", "uid") == 0


def _job(name: str, conninfo: str, tmp: Path, sink: PostgresSink, rows: int = 50) -> Any:
    p = Pipeline(name, checkpoint={"interval": 0.1, "storage": str(tmp / "chk")},
                 restart=FixedDelayRestart(attempts=3, delay=0))  # fmt: skip
    p.source(GeneratorSource(num_splits=1, records_per_split=rows, batch_size=10)).sink(sink)
    return p.run(runtime="local", restore="none")


def test_max_prepared_transactions_zero_fails_at_start_in_one_line(tmp_path: Path) -> None:
    with PostgresServer(max_prepared_transactions=0) as pg:
        db = pg.new_database()
        with pytest.raises((ConfigError, JobFailedError)) as err:
            _job("no-2pc", db, tmp_path, PostgresSink(db, "t"))
        text = str(err.value)
        assert "\n" not in text and "max_prepared_transactions = 0" in text and "postgresql.conf" in text, text
        assert "a restart cannot cure this" in text or isinstance(err.value, ConfigError)
        assert PASSWORD not in text
        assert pg.query("SELECT to_regclass('t')", conninfo=db) == [(None,)]  # nothing written


def test_a_table_that_does_not_fit_names_both_schemas(postgres: PostgresServer, tmp_path: Path) -> None:
    db = postgres.new_database()
    postgres.query("CREATE TABLE t (id text, other int NOT NULL)", conninfo=db)
    with pytest.raises((ConfigError, JobFailedError)) as err:
        _job("misfit", db, tmp_path, PostgresSink(db, "t"))
    text = str(err.value)
    assert "\n" not in text and "id: int64" in text and "id text" in text and "other integer" in text, text
    postgres.query("CREATE TABLE u (id bigint, v text)", conninfo=db)
    with pytest.raises(ConfigError) as err:
        PostgresSink(db, "u", mode="upsert", key_columns=["id"], schema=pa.schema([("id", pa.int64())])).recover("j", [])
    assert "primary key or unique index" in str(err.value)


def test_passwords_never_shown(postgres: PostgresServer, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    db = postgres.new_database()
    caplog.set_level(logging.DEBUG)
    sink = PostgresSink(db, "t")
    assert PASSWORD not in repr(sink) and PASSWORD not in repr(sink.options)
    result = _job("pw", db, tmp_path, sink)
    assert result.status == "finished"
    assert postgres.query("SELECT count(*) FROM t", conninfo=db) == [(50,)]
    wrong = db.replace(PASSWORD, "not-the-password-123")
    with pytest.raises(SluiceError) as err:
        PostgresSink(wrong, "t").recover("j", [])
    assert "not-the-password-123" not in str(err.value) and "password authentication failed" in str(err.value)
    bad_port = PostgresSink(f"host=127.0.0.1 port=1 user=u password={PASSWORD} dbname=d connect_timeout=2", "t", outage_timeout_s=0)
    with pytest.raises(SluiceError) as err:
        bad_port.committed_checkpoint("j", "uid")
    assert PASSWORD not in str(err.value) and "u@127.0.0.1:1/d" in str(err.value)
    with pytest.raises(ConfigError) as err:
        PostgresSink(f"postgresql://u:{PASSWORD}@h:5432/d?bogus_option=1", "t")
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert PASSWORD not in logged and PASSWORD not in str(err.value) and "\n" not in str(err.value)
