"""Done when: from a second shell, `sluice jobs` lists a running `sluice run job.py`, `sluice savepoint`
takes one, `sluice stop --savepoint` ends it, and `sluice run job.py --restore <savepoint>` resumes it
with output exactly once (Kafka source on the test broker, Parquet file sink). Every CLI call is a new
process; the job's own process logs at -vv, and its token appears in none of that output."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests import listing
from tests.connectors.kafka.helpers import produce_json
from tests.control.conftest import sluice, sluice_json, wait_for
from tests.kafka_broker import TansuBroker

pytestmark = [pytest.mark.kafka, pytest.mark.tansu("job control from the CLI over plain records: no tansu quirk touched")]

JOB = textwrap.dedent(
    """
    import json, os, time
    import pyarrow as pa
    from sluice import CheckpointConfig, Pipeline
    from sluice.connectors.kafka import KafkaSource
    from sluice.sinks.files import FileSink

    SCHEMA = pa.schema([("id", pa.int64()), ("p", pa.int64()), ("ts", pa.int64())])
    stop = json.loads(os.environ.get("JOB_STOP") or "null")

    def slow(batch):
        time.sleep(0.005)
        return batch

    pipeline = Pipeline("orders-e2e", parallelism=2,
                        checkpoint=CheckpointConfig(interval=0.3, storage=os.environ["JOB_DIR"] + "/chk"))
    source = KafkaSource(os.environ["JOB_BOOTSTRAP"], os.environ["JOB_TOPIC"], format="json", schema=SCHEMA,
                         batch_size=50, stopping_offsets={(t, p): o for t, p, o in stop} if stop else None)
    pipeline.source(source).map_batches(slow, name="enrich").sink(FileSink(os.environ["JOB_DIR"] + "/out"))
    """
)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def committed_ids(out: Path) -> list[int]:
    if not any(rel.endswith(".parquet") for rel in listing.files(out, only_visible=True)):  # listed while the job runs
        return []
    return sorted(pq.read_table(out).column("id").to_pylist())


def test_operate_a_running_job_from_another_shell(broker: TansuBroker, topic: Callable[..., str], tmp_path: Path) -> None:
    t = topic(2)
    tokens: list[str] = []
    token_file = tmp_path / "chk" / "orders-e2e" / "_control.token"
    ids = produce_json(broker, t, {0: range(0, 1500), 1: range(1500, 3000)})
    job = tmp_path / "job.py"
    job.write_text(JOB)
    chk = str(tmp_path / "chk")
    env = {**os.environ, "JOB_DIR": str(tmp_path), "JOB_BOOTSTRAP": broker.bootstrap, "JOB_TOPIC": t, "JOB_STOP": ""}
    cmd = [sys.executable, "-m", "sluice.cli", "-vv", "run", str(job), "--runtime", "local", "--progress-interval", "1"]
    with open(tmp_path / "run.out", "w") as out, open(tmp_path / "run.err", "w") as err:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, text=True)
    try:
        alive = lambda: proc.poll() is None  # noqa: E731
        listed = wait_for("sluice jobs lists the job", lambda: [
            j for j in sluice_json("jobs", "--storage", chk) if j["job_id"] == "orders-e2e" and j["status"] == "running"
        ], alive=alive)
        assert listed[0]["runtime"] == "local" and listed[0]["url"].startswith("http://127.0.0.1:")
        tokens.append(token_file.read_text())
        assert token_file.stat().st_mode & 0o777 == 0o600
        table = sluice("jobs", "--storage", chk).stdout
        assert "orders-e2e" in table and "running" in table
        wait_for("a checkpoint and some output", lambda: committed_ids(tmp_path / "out"), alive=alive)

        savepoint = sluice_json("savepoint", "orders-e2e", "--storage", chk)["path"]
        assert "savepoint-" in savepoint and (Path(savepoint) / "_metadata").exists()
        ids += produce_json(broker, t, {0: range(3000, 3500), 1: range(3500, 4000)})  # while it runs
        status = sluice("status", "orders-e2e", "--storage", chk).stdout
        assert "running" in status and "kafka -> enrich" in status and "checkpoints:" in status

        stopped = sluice_json("stop", "orders-e2e", "--storage", chk, "--savepoint")
        assert stopped["status"] == "stopped" and "savepoint-" in stopped["stopped_at"]
        assert proc.wait(120) == 0, (tmp_path / "run.err").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    partial = committed_ids(tmp_path / "out")
    assert 0 < len(partial) <= len(ids) and len(set(partial)) == len(partial)
    assert not [j for j in sluice_json("jobs", "--storage", chk) if j["job_id"] == "orders-e2e"]
    ids += produce_json(broker, t, {0: range(4000, 4200), 1: range(4200, 4400)})  # while it is stopped

    # resumed from the savepoint (a restored split keeps its end, as in Flink: the job stays unbounded);
    # once everything is committed, stop it again from another shell
    with open(tmp_path / "resumed.err", "w") as err:
        resumed = subprocess.Popen([*cmd, "--restore", stopped["stopped_at"]], env=env, stdout=err, stderr=err)
    try:
        tokens.append(wait_for("the resumed job's token", lambda: _read(token_file) not in ("", tokens[0]) and _read(token_file)))
        wait_for("the resumed job commits everything", lambda: len(committed_ids(tmp_path / "out")) >= len(ids),
                 alive=lambda: resumed.poll() is None)
        assert sluice_json("stop", "orders-e2e", "--storage", chk)["status"] == "stopped"
        assert resumed.wait(120) == 0, (tmp_path / "resumed.err").read_text()
    finally:
        if resumed.poll() is None:
            resumed.kill()
            resumed.wait()
    assert committed_ids(tmp_path / "out") == sorted(ids)  # nothing lost, nothing twice

    logs = (tmp_path / "run.err").read_text() + (tmp_path / "run.out").read_text()
    assert "control endpoint and dashboard at http://127.0.0.1:" in logs
    assert "read " in logs and "/s" in logs  # the plain progress lines
    assert "orders-e2e" in logs and "DEBUG" in logs  # -vv: the job's logs are all there
    for name in ("run.err", "run.out", "resumed.err"):
        text = (tmp_path / name).read_text()
        assert all(tok not in text for tok in tokens), f"the token appears in {name}"
    assert not token_file.exists()  # removed when the job ended
