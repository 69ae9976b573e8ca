"""``sluice new --template kafka-windowed-aggregation``: the scaffolded job builds, and run against a real
broker it writes per-minute totals per key equal to DuckDB's over the produced events."""

from __future__ import annotations

import json
import runpy
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset
import pytest
from click.testing import CliRunner
from sluice.cli import main

from tests.windows.helpers import sql


def invoke(*args: str) -> str:
    r = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return r.output


def test_the_windowed_template_builds_and_is_listed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert "Kafka (JSON) -> per-minute totals per key" in invoke("new", "--list")
    monkeypatch.chdir(tmp_path)
    invoke("new", "minute-totals", "--template", "kafka-windowed-aggregation")
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "broker-a:9093")
    ns = runpy.run_path(str(tmp_path / "minute_totals.py"), run_name="check")
    kinds = {type(n.spec).__name__ for n in ns["pipeline"].build().logical.nodes.values()}
    assert {"KafkaSource", "FileSink"} <= kinds


@pytest.mark.kafka
def test_the_windowed_template_runs_against_kafka(apache_kafka: Any, kafka_topic: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t = kafka_topic(1)
    events = [
        {"id": i, "kind": "abc"[i % 3], "amount": float(i % 11), "ts": 1_700_000_000_000 + i * 4_000} for i in range(50)
    ]
    apache_kafka.produce(t, [json.dumps(e).encode() for e in events], partition=0)  # one batch: "latest" is its end
    monkeypatch.chdir(tmp_path)
    for k, v in {"KAFKA_BOOTSTRAP_SERVERS": apache_kafka.bootstrap, "KAFKA_TOPIC": t, "KAFKA_STOPPING_OFFSETS": "latest"}.items():
        monkeypatch.setenv(k, v)
    invoke("new", "minute-totals", "--template", "kafka-windowed-aggregation")
    out = invoke("run", "minute_totals.py", "--runtime", "local")
    assert "finished after 1 attempt(s)" in out
    got = pyarrow.dataset.dataset(str(tmp_path / "output" / "minute-totals" / "totals"), format="parquet").to_table()
    expected = sql(
        """select kind, ts - ts % 60000 as window_start, count(*) as count, sum(amount) as sum_amount,
        max(amount) as max_amount, avg(amount) as mean_amount from x group by all""",
        x=pa.Table.from_pylist(events),
    )
    cols = ["kind", "window_start", "count", "sum_amount", "max_amount", "mean_amount"]
    assert sorted(tuple(r.values()) for r in got.select(cols).to_pylist()) == sorted(
        tuple(r.values()) for r in expected
    )
