"""A documented way to try the job templates: ``sluice broker`` starts a throw-away broker, and each template
says which extra it needs.

``sluice broker --topic events:2 --sample-events N`` (what every Kafka template's docstring says) and the
template's own ``Run it`` line: the job's output equals the valid sample events, computed from their
definition (the input), not from the job.
"""

from __future__ import annotations

import ast
import json
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


def _try_it(doc: str) -> list[str]:
    """The arguments of the ``sluice broker`` command a template's docstring says to try it with."""
    m = re.search(r"^Try it: +sluice broker (.+?) +\(", doc, re.M)
    assert m, doc
    return m[1].split()


def _committed_ids(bootstrap: str, topic: str) -> list[int]:
    """The ``id`` of every record a ``read_committed`` reader sees in ``topic`` now (a plain consumer)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "judge", "isolation.level": "read_committed",
                  "enable.auto.commit": False, "enable.partition.eof": True, "log_level": 0})  # fmt: skip
    try:
        partitions = c.list_topics(topic, timeout=10).topics[topic].partitions
        c.assign([TopicPartition(topic, p, 0) for p in partitions])
        ids, ended, deadline = [], set(), time.monotonic() + 20
        while len(ended) < len(partitions) and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                ended.add(m.partition())
            else:
                ids.append(json.loads(m.value())["id"])
        return sorted(ids)
    finally:
        c.close()


@pytest.mark.kafka
@pytest.mark.parametrize("template", ["kafka-to-parquet", "kafka-to-kafka"])
def test_sluice_broker_runs_a_template_end_to_end(template: str, tmp_path: Path) -> None:
    """The broker started with the template's own ``Try it`` line, the job with its ``Run it`` line: the
    output (Parquet files, or what a read_committed reader of the output topic sees) holds each valid sample
    event once. Before: ``--sample-events`` filled every topic, the output topic too, and the Kafka
    template's line named no output topic (the job refused to start)."""
    port = _free_port()
    path = render_template(template, "try_it", str(tmp_path))
    args = _try_it(ast.get_docstring(ast.parse(path.read_text())) or "")
    args[args.index("--sample-events") + 1] = str(EVENTS)
    cmd = [sys.executable, "-m", "sluice.cli", "broker", "--port", str(port), *args]
    broker = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    job = None
    try:
        bootstrap = _line(broker, "export KAFKA_BOOTSTRAP_SERVERS=", time.monotonic() + 120).split("=", 1)[1]
        assert bootstrap == f"127.0.0.1:{port}"
        env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": bootstrap}
        run = [sys.executable, "-m", "sluice.cli", "run", "try_it.py", "--runtime", "local", "--no-progress"]
        job = subprocess.Popen(run, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        want = sorted(i for i in range(EVENTS) if sample_event(i)["amount"] >= 0)
        got: list[int] = []
        deadline = time.monotonic() + 180
        while got != want and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
            if template == "kafka-to-kafka":
                got = _committed_ids(bootstrap, "events-clean")
                continue
            try:
                table = ds.dataset(str(tmp_path / "output" / "try_it" / "events"), format="parquet").to_table()
            except (FileNotFoundError, OSError):
                continue
            got = sorted(table["id"].to_pylist()) if "id" in table.column_names else []
        assert got == want, f"{len(got)} of {len(want)} valid events committed: {job.stderr.read() if job.poll() is not None and job.stderr else ''}"
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
            assert re.search(r"sluice broker --topic events:2 (--topic \S+ )*--sample-events 1000", doc), template
