"""The control endpoint of a running job (in-process runtime): authentication, the API, the registry."""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from sluice import CheckpointConfig, ConfigError, Pipeline
from sluice.client import JobClient
from sluice.connectors.generator import GeneratorSource
from sluice.control.client import ControlClient, ControlError
from sluice.control.registry import read_entries
from sluice.sinks.testing import TwoPhaseCommitTestSink, read_committed

from tests.control.conftest import request, wait_for


def slow(batch: pa.RecordBatch) -> pa.RecordBatch:
    time.sleep(0.002)
    return batch


def start(tmp_path: Path, name: str = "ctl", **kw: Any) -> JobClient:
    p = Pipeline(name, parallelism=2, checkpoint=CheckpointConfig(interval=0.1, storage=str(tmp_path / "chk")))
    src = GeneratorSource(num_splits=2, records_per_split=10**7, batch_size=20, rows_per_second=4000)
    p.source(src).rebalance().map_batches(slow, name="enrich").sink(TwoPhaseCommitTestSink(str(tmp_path / "out")))
    return p.start(runtime="local", restore="none", **kw)


def test_requests_without_the_token_are_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)  # everything any logger says, aiohttp's included
    client = start(tmp_path)
    try:
        ep = client.control
        token_file = Path(ep.token_file)
        assert token_file.stat().st_mode & 0o777 == 0o600  # only the user can read it
        token = token_file.read_text()
        for path in ("/api/v1/job", "/api/v1/graph", "/api/v1/metrics", "/metrics", "/api/v1/checkpoints"):
            assert request(ep.url + path)[0] == 401, path
            assert request(ep.url + path, headers={"Authorization": "Bearer wrong"})[0] == 401, path
            assert request(ep.url + path, headers={"Authorization": f"Bearer {token}"})[0] == 200, path
        for path in ("/api/v1/savepoint", "/api/v1/stop", "/api/v1/cancel"):
            assert request(ep.url + path, "POST", body=b"{}")[0] == 401, path
        assert client.status == "running"  # none of the refused actions happened
        status, page, headers = request(ep.url + "/login")
        assert status == 200 and "<form" in page and str(token_file) in page and token not in page
        assert headers["X-Frame-Options"] == "DENY" and headers["Referrer-Policy"] == "no-referrer"
        # an old address with ?token= is neither accepted nor kept: it goes to the login page
        status, _, headers = request(ep.url + f"/?token={token}")
        assert status == 303 and headers["Location"] == "/login" and "Set-Cookie" not in headers
        # the token is a Bearer header, never a cookie
        assert request(ep.url + "/api/v1/job", headers={"Cookie": f"sluice_session={token}"})[0] == 401
        entry = (tmp_path / "chk" / "ctl" / "_control.json").read_text()
        assert token not in entry and ep.url in entry
    finally:
        client.cancel()
    logged = caplog.text + "".join(str(r.args) for r in caplog.records)
    assert token not in logged


def test_api_status_graph_metrics_checkpoints_and_actions(tmp_path: Path) -> None:
    client = start(tmp_path)
    ep = client.control
    api = ControlClient(ep.url, Path(ep.token_file).read_text())
    try:
        wait_for("three checkpoints", lambda: api.get("/api/v1/job")["checkpoint_counts"]["completed"] >= 3)
        job = api.get("/api/v1/job")
        assert job["job_id"] == "ctl" and job["status"] == "running" and job["runtime"] == "local"
        assert job["attempt"] == 0 and job["restarts"] == 0 and job["last_checkpoint"]["status"] == "completed"
        graph = api.get("/api/v1/graph")
        assert [(v["name"], v["parallelism"]) for v in graph["vertices"]] == [
            ("generator", 2), ("rebalance -> enrich -> test-sink", 2)
        ]
        assert graph["vertices"][1]["inputs"] == [{"from": 0, "partitioning": "rebalance", "unaligned_ok": True}]
        metrics = wait_for("rates", lambda: (m := api.get("/api/v1/metrics"))["vertices"][0]["rates"] and m)
        src = metrics["vertices"][0]
        assert src["totals"]["records_in"] > 0 and src["rates"]["records_in_per_s"] > 0
        assert [s["index"] for s in src["subtasks"]] == [0, 1]
        history = api.get("/api/v1/checkpoints?limit=2")
        assert len(history["history"]) == 2 and history["counts"]["completed"] >= 3
        cid = job["last_checkpoint"]["checkpoint_id"]
        detail = api.get(f"/api/v1/checkpoints/{cid}")
        assert set(detail["phases"]) == {"alignment_s", "sync_s", "async_s"} and len(detail["tasks"]) == 4
        with pytest.raises(ControlError, match="has no checkpoint 99999"):
            api.get("/api/v1/checkpoints/99999")
        prometheus = api.text("/metrics")
        assert 'sluice_task_records_in_total{job="ctl",subtask="0",vertex="generator"}' in prometheus
        assert "sluice_checkpoint_last_duration_seconds" in prometheus and "process_cpu_seconds_total" in prometheus

        path = api.post("/api/v1/savepoint")["path"]
        assert "savepoint-" in path and (Path(path) / "_metadata").exists()
        stopped = api.post("/api/v1/stop", {"savepoint": True, "drain": True})
        assert stopped["status"] == "stopped" and "savepoint-" in stopped["stopped_at"]
        result = client.wait(60)
        assert result.status == "stopped" and result.stopped_at == stopped["stopped_at"]
    finally:
        if client.running:
            client.cancel()
    ep.close()
    with pytest.raises(ControlError, match="does not answer"):
        api.get("/api/v1/job")
    (entry,) = read_entries(str(tmp_path / "chk"))
    assert entry.status == "stopped" and not entry.running and not Path(ep.token_file).exists()
    assert read_committed(str(tmp_path / "out")) is not None


def test_cancel_through_the_endpoint(tmp_path: Path) -> None:
    client = start(tmp_path, "cancelled")
    api = ControlClient(client.control.url, Path(client.control.token_file).read_text())
    assert api.post("/api/v1/cancel")["status"] == "cancelled"
    assert client.wait(60).status == "cancelled"


def test_the_address_is_checked_and_the_endpoint_can_be_off(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="control_endpoint: expected HOST:PORT"):
        start(tmp_path, control_endpoint="localhost")
    taken = socket.create_server(("127.0.0.1", 0))
    try:
        with pytest.raises(ConfigError, match="cannot listen on"):
            start(tmp_path, control_endpoint=f"127.0.0.1:{taken.getsockname()[1]}")
    finally:
        taken.close()
    client = start(tmp_path, "quiet", control_endpoint=None)
    try:
        assert client.control is None and not (tmp_path / "chk" / "quiet" / "_control.json").exists()
    finally:
        client.cancel()
