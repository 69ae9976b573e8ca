"""A short PostgreSQL outage costs no restart: ``PostgresSink(outage_timeout_s=...)`` rides it out.

The server is crashed (``pg_ctl stop -m immediate``) while the job writes, and started again 3 s later; the
sink's pre-commits and commits in between try again on new connections (it was 3-5 restarts before). The
judge is the input: the table holds every id the source produced, once. The fault counts only if the sink
met the outage (it logged that the server was unreachable) while the job ran.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pyarrow as pa
import pytest
from sluice import FixedDelayRestart, Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.errors import ConfigError, SluiceError
from sluice.sinks.postgres import PostgresSink

from tests.postgres_server import PASSWORD, PostgresServer

ROWS = 3_000
RATE = 200.0  # rows per second: the job runs about 15 s, so the outage falls inside it


def _ids(split: int, start: int, end: int) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(range(start, end), pa.int64())})


def _wait(condition: object, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_3_second_outage_is_ridden_out_without_a_restart(
    killable_postgres: PostgresServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pg = killable_postgres
    db = pg.new_database()
    caplog.set_level(logging.WARNING, logger="sluice.sinks.postgres")
    p = Pipeline("pg-outage", checkpoint={"interval": 0.2, "storage": str(tmp_path / "chk")},
                 restart=FixedDelayRestart(attempts=5, delay=0))  # fmt: skip
    source = GeneratorSource(num_splits=1, records_per_split=ROWS, batch_size=20, rows_per_second=RATE, rows=_ids)
    p.source(source).sink(PostgresSink(db, "t"))  # outage_timeout_s: its default (30 s)
    client = p.start(runtime="local", restore="none", control_endpoint=None)

    def committed() -> bool:
        if pg.query("SELECT to_regclass('t')", conninfo=db) == [(None,)]:
            return False
        return bool(pg.query("SELECT EXISTS (SELECT 1 FROM t)", conninfo=db)[0][0])

    _wait(committed, "a first committed checkpoint")
    pg.kill()
    time.sleep(3.0)  # the outage itself
    met = [r for r in caplog.records if "unreachable" in r.getMessage()]
    running = client.running
    pg.start()
    result = client.wait(300)
    assert met and running, "the fault did not fire: the sink never met the outage while the job ran"
    assert result.status == "finished" and result.attempts == 1, (result.attempts, result.failures)
    ids = [r[0] for r in pg.query("SELECT id FROM t ORDER BY id", conninfo=db)]
    assert ids == list(range(ROWS)), f"{len(ids)} rows, {len(set(ids))} distinct, expected {ROWS}"


def test_outage_timeout_is_checked_and_a_refused_login_fails_at_once(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match="outage_timeout_s must be a number of seconds >= 0"):
        PostgresSink("host=h dbname=d", "t", outage_timeout_s=-1)
    db = postgres.new_database()
    wrong = db.replace(PASSWORD, "not-the-password-123")
    p = Pipeline("pg-login", checkpoint={"storage": str(tmp_path / "chk")}, restart=FixedDelayRestart(attempts=5, delay=1))
    p.source(GeneratorSource(num_splits=1, records_per_split=10)).sink(PostgresSink(wrong, "t"))
    started = time.monotonic()
    with pytest.raises(SluiceError) as err:
        p.run(runtime="local", restore="none", control_endpoint=None)
    text = str(err.value)
    assert time.monotonic() - started < 30, "a refused login must not be ridden out nor restarted"
    assert text.startswith("sink 'postgres-sink': PostgresSink: cannot connect to sluice@127.0.0.1:"), text
    assert "password authentication failed" in text and "not-the-password-123" not in text, text
    assert "\n" not in text
