"""A documented way to try the job templates: ``sluice broker`` starts a throw-away broker, and each template
says which extra it needs.

``sluice broker --topic events:2 --sample-events N`` (what every Kafka template's docstring says) and the
template's own ``Run it`` line: the job's output equals the valid sample events, computed from their
definition (the input), not from the job.
"""

from __future__ import annotations

import ast
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.dataset as ds
import pytest
from sluice.cli.scaffold import available_templates, render_template
from sluice.templates.broker_cli import sample_event

EVENTS = 300
#: a sink module -> the extra it needs (pyproject.toml's optional-dependencies)
EXTRAS = {"sluice.sinks.delta": "delta", "sluice.sinks.iceberg": "iceberg", "sluice.sinks.postgres": "postgres"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _line(proc: subprocess.Popen[str], prefix: str, deadline: float) -> str:
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(prefix):
            return line.strip()
        assert line or proc.poll() is None, f"sluice broker ended: {proc.stderr.read() if proc.stderr else ''}"
    raise AssertionError(f"no line {prefix!r} from sluice broker")


@pytest.mark.kafka
def test_sluice_broker_runs_a_template_end_to_end(tmp_path: Path) -> None:
    port = _free_port()
    cmd = [sys.executable, "-m", "sluice.cli", "broker", "--port", str(port), "--topic", "events:2",
           "--sample-events", str(EVENTS)]  # fmt: skip
    broker = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    job = None
    try:
        bootstrap = _line(broker, "export KAFKA_BOOTSTRAP_SERVERS=", time.monotonic() + 120).split("=", 1)[1]
        assert bootstrap == f"127.0.0.1:{port}"
        render_template("kafka-to-parquet", "try_it", str(tmp_path))
        env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": bootstrap}
        run = [sys.executable, "-m", "sluice.cli", "run", "try_it.py", "--runtime", "local", "--no-progress"]
        job = subprocess.Popen(run, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        want = sorted(i for i in range(EVENTS) if sample_event(i)["amount"] >= 0)
        got: list[int] = []
        deadline = time.monotonic() + 180
        while got != want and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
            try:
                table = ds.dataset(str(tmp_path / "output" / "events"), format="parquet").to_table()
            except (FileNotFoundError, OSError):
                continue
            got = sorted(table["id"].to_pylist()) if "id" in table.column_names else []
        assert got == want, f"{len(got)} of {len(want)} valid events committed"
        job.send_signal(signal.SIGTERM)
        out, err = job.communicate(timeout=120)
        assert job.returncode == 0 and "stopped at" in out, err
    finally:
        for p in (job, broker):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGINT)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
    assert broker.returncode == 0, broker.stderr.read() if broker.stderr else ""


def test_each_job_template_says_which_extra_it_needs(tmp_path: Path) -> None:
    jobs = [t for t in available_templates() if t not in ("source", "sink")]
    assert len(jobs) >= 9, jobs
    for template in jobs:
        path = render_template(template, f"t_{template.replace('-', '_')}", str(tmp_path))
        tree = ast.parse(path.read_text())
        doc = ast.get_docstring(tree) or ""
        needs = re.search(r"^Needs: +(.+)$", doc, re.M)
        assert needs, f"{template}: no 'Needs:' line in its docstring"
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        extras = sorted(EXTRAS[m] for m in imported if m in EXTRAS)
        named = re.findall(r"sluice-etl\[(\w+)\]", needs[1])
        assert named == extras, f"{template}: says {named}, imports need {extras}"
        if not extras:
            assert "sluice-etl alone (no extra" in needs[1], needs[1]
        if "sluice.connectors.kafka" in imported and "debezium" not in template:
            assert "sluice broker --topic events:2 --sample-events 1000" in doc, f"{template}: no broker to try it"
