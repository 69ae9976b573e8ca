"""A newcomer's tour, as README.md and the templates tell it, in one empty folder (a user's project folder).

README.md says: ``sluice --version``; ``sluice new --list``; ``sluice new my_job`` scaffolds a job from a
template; ``sluice broker --topic events:2 --sample-events 1000`` runs a throw-away broker with sample events
of the templates' shape; then each template's own ``Run it`` line (``KAFKA_BOOTSTRAP_SERVERS=... sluice run
my_job.py --runtime local``) and, for a table, its ``Read it`` line. This test does exactly that, with the
``sluice`` command of this environment, changing only the broker's port (a free one instead of 9092) and the
number of sample events: the Kafka templates that need no service beside the broker, scaffolded side by side
in one folder and run at the same time, as a newcomer trying several would. Each output must equal the valid
sample events, computed from their definition (the input: ``sample_event``), not from the job; each job,
stopped with SIGTERM, must end with status 0 at a savepoint, its output unchanged (nothing written twice);
each ``Read it`` line must run as written and show the rows. Between them, what README says reaches a
running job from another shell: ``sluice jobs`` lists the four, ``sluice status`` without a job id names them
(several run), ``sluice status JOB`` shows one; after the stop ``sluice checkpoints list ./checkpoints`` asks
which job, and lists its completed checkpoints when told.

The README's and docs' job examples are run by tests/test_docs_jobs.py, the demo by tests/cli/test_demo.py,
the templates one at a time on Apache Kafka by tests/cli/test_cli.py; this is the walk between them.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from sluice.cli.scaffold import available_templates
from sluice.templates.broker_cli import sample_event

EVENTS = 400
#: the Kafka job templates a newcomer can try with ``sluice broker`` alone (no PostgreSQL, no Debezium)
TOURED = ("kafka-to-parquet", "kafka-to-delta", "kafka-to-iceberg", "kafka-to-kafka")
DEADLINE_S = 180.0
BIN = Path(sys.executable).parent


def _sluice(args: list[str], cwd: Path) -> str:
    r = subprocess.run([str(BIN / "sluice"), *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"sluice {' '.join(args)}: {r.stdout}\n{r.stderr}"
    return r.stdout


def _doc_line(doc: str, label: str, containing: str = "") -> str:
    """The command of a template docstring's ``<label>:`` block line that contains ``containing``, without
    its trailing ``(...)`` note."""
    m = re.search(rf"^{label}: +(.*(?:\n {{9}}.*)*)", doc, re.M)
    assert m, f"no {label!r} line in:\n{doc}"
    lines = [line.strip() for line in m[1].splitlines()]
    line = next(line for line in lines if containing in line)
    return re.sub(r"\s+\(.*$", "", line)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _committed_ids(bootstrap: str, topic: str) -> list[int] | None:
    """The ``id`` of every record a plain ``read_committed`` consumer sees in ``topic`` now."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "tour-judge", "isolation.level": "read_committed",
                  "enable.auto.commit": False, "enable.partition.eof": True, "log_level": 0})  # fmt: skip
    try:
        partitions = c.list_topics(topic, timeout=10).topics[topic].partitions
        c.assign([TopicPartition(topic, p, 0) for p in partitions])
        ids: list[int] = []
        ended: set[int] = set()
        deadline = time.monotonic() + 20
        while len(ended) < len(partitions) and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                ended.add(m.partition() or 0)
            else:
                ids.append(json.loads(m.value() or b"{}")["id"])
        return sorted(ids) if len(ended) == len(partitions) else None
    finally:
        c.close()


def _output_ids(template: str, folder: Path, module: str, bootstrap: str) -> list[int] | None:
    """What the job of ``template`` committed (ids, sorted), read with each format's own reader."""
    try:
        if template == "kafka-to-parquet":
            table = ds.dataset(str(folder / "output" / module / "events"), format="parquet").to_table()
        elif template == "kafka-to-delta":
            from deltalake import DeltaTable

            table = DeltaTable(str(folder / "tables" / "events")).to_pyarrow_table()
        elif template == "kafka-to-iceberg":
            from pyiceberg.catalog.sql import SqlCatalog

            catalog = SqlCatalog("sluice", uri=f"sqlite:///{folder}/warehouse/catalog.db")
            table = catalog.load_table("analytics.events").scan().to_arrow()
        else:
            return _committed_ids(bootstrap, "events-clean")
    except Exception:  # not there yet (no table, no file): the job has not committed a checkpoint
        return None
    return sorted(table.column("id").to_pylist()) if "id" in table.column_names else None


def _stop(proc: subprocess.Popen[str] | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.kafka
def test_a_newcomer_tours_readme_and_the_templates(tmp_path: Path) -> None:
    assert _sluice(["--version"], tmp_path).split() == ["sluice", version("sluice-etl")]
    listed = {line.split()[0] for line in _sluice(["new", "--list"], tmp_path).splitlines() if line.strip()}
    assert listed == set(available_templates()) and set(TOURED) <= listed, listed
    modules = {t: f"try_{t.replace('-', '_')}" for t in TOURED}
    docs: dict[str, str] = {}
    for template, module in modules.items():
        _sluice(["new", module, "--template", template], tmp_path)
        docs[template] = ast.get_docstring(ast.parse((tmp_path / f"{module}.py").read_text())) or ""

    # one broker with every topic the templates' "Try it" lines name (they differ only in the output topic)
    topics: list[str] = []
    for doc in docs.values():
        args = shlex.split(_doc_line(doc, "Try it"))
        assert args[:2] == ["sluice", "broker"] and "--sample-events" in args, args
        topics += [a for i, a in enumerate(args) if args[i - 1] == "--topic" and a not in topics]
    port = _free_port()
    cmd = [str(BIN / "sluice"), "broker", "--port", str(port), "--sample-events", str(EVENTS)]
    cmd += [x for t in topics for x in ("--topic", t)]
    broker = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    jobs: dict[str, subprocess.Popen[str]] = {}
    try:
        bootstrap = _await_bootstrap(broker)
        env_base = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
        for template, module in modules.items():
            words = shlex.split(_doc_line(docs[template], "Run it", "--runtime local"))
            settings = dict(w.split("=", 1) for w in words if re.match(r"^[A-Z_]+=", w))
            argv = [w for w in words if not re.match(r"^[A-Z_]+=", w)]
            assert argv == ["sluice", "run", f"{module}.py", "--runtime", "local"], argv
            settings = {k: v.replace("localhost:9092", bootstrap) for k, v in settings.items()}
            assert settings == {"KAFKA_BOOTSTRAP_SERVERS": bootstrap}, settings
            out, err = (tmp_path / f"{module}.out").open("w"), (tmp_path / f"{module}.err").open("w")
            jobs[template] = subprocess.Popen(
                [str(BIN / argv[0]), *argv[1:]], cwd=tmp_path, env={**env_base, **settings}, stdout=out,
                stderr=err, text=True,
            )  # fmt: skip
        want = sorted(i for i in range(EVENTS) if sample_event(i)["amount"] >= 0)
        got: dict[str, Any] = {}
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline and any(got.get(t) != want for t in TOURED):
            for template, proc in jobs.items():
                assert proc.poll() is None, f"{template}: the job ended by itself: {_err(tmp_path, modules[template])}"
                if got.get(template) != want:
                    got[template] = _output_ids(template, tmp_path, modules[template], bootstrap)
            time.sleep(0.5)
        for template in TOURED:
            n = len(got.get(template) or [])
            assert got.get(template) == want, f"{template}: {n} of {len(want)} ids: {_err(tmp_path, modules[template])}"
        # README: "sluice jobs|status|... reach it from another shell"
        listing = _sluice(["jobs"], tmp_path)
        for module in modules.values():
            assert re.search(rf"^ *{module} +running ", listing, re.M), listing
        r = subprocess.run([str(BIN / "sluice"), "status"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and all(m in r.stderr for m in modules.values()), r.stdout + r.stderr  # which one?
        assert "running" in _sluice(["status", modules["kafka-to-parquet"]], tmp_path)
        for proc in jobs.values():
            proc.send_signal(signal.SIGTERM)
        for template, proc in jobs.items():
            rc = proc.wait(timeout=120)
            stdout = (tmp_path / f"{modules[template]}.out").read_text()
            assert rc == 0 and "stopped at " in stdout, f"{template}: rc {rc}\n{stdout}\n{_err(tmp_path, modules[template])}"
            assert "resume with: sluice run" in stdout, stdout
            after = _output_ids(template, tmp_path, modules[template], bootstrap)
            assert after == want, f"{template}: output changed after the stop ({len(after or [])} ids)"
    finally:
        for proc in jobs.values():
            _stop(proc)
        _stop(broker)
    r = subprocess.run([str(BIN / "sluice"), "checkpoints", "list", "./checkpoints"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 1 and "holds several jobs: pass --job (one of try_kafka_to_delta," in r.stderr, r.stderr
    # the windowed template's "Inspect" line, with a job named
    assert " completed " in _sluice(["checkpoints", "list", "./checkpoints", "--job", modules["kafka-to-delta"]], tmp_path)
    for template in ("kafka-to-delta", "kafka-to-iceberg"):  # the "Read it" lines, as written
        words = shlex.split(_doc_line(docs[template], "Read it"))
        assert words[:2] == ["python", "-c"], words
        r = subprocess.run([sys.executable, *words[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"{template}'s Read it line: {r.stderr[-2000:]}"
        assert "pyarrow.Table" in r.stdout and "id: int64" in r.stdout, r.stdout[-2000:]


def _await_bootstrap(broker: subprocess.Popen[str]) -> str:
    """The address ``sluice broker`` prints (``export KAFKA_BOOTSTRAP_SERVERS=...``) once it is ready."""
    assert broker.stdout is not None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = broker.stdout.readline()
        if line.startswith("export KAFKA_BOOTSTRAP_SERVERS="):
            return line.strip().split("=", 1)[1]
        assert line or broker.poll() is None, f"sluice broker ended: {broker.stderr.read() if broker.stderr else ''}"
    raise AssertionError("sluice broker printed no address in 120 s")


def _err(folder: Path, module: str) -> str:
    return (folder / f"{module}.err").read_text()[-3000:]
