"""The CLI verbs as a user runs them: each a new process, against a `sluice run` in another one."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from sluice import CheckpointConfig, Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.control.progress import Progress, summary_line
from sluice.sinks.testing import TwoPhaseCommitTestSink

from tests.control.conftest import sluice, sluice_json, wait_for

JOB = textwrap.dedent(
    """
    import os, time
    from sluice import CheckpointConfig, Pipeline
    from sluice.connectors.generator import GeneratorSource
    from sluice.sinks.testing import TwoPhaseCommitTestSink

    def slow(batch):
        time.sleep(0.002)
        return batch

    pipeline = Pipeline("verbs", parallelism=2,
                        checkpoint=CheckpointConfig(interval=0.2, storage=os.environ["JOB_DIR"] + "/chk"))
    source = GeneratorSource(num_splits=2, records_per_split=10**8, batch_size=20, rows_per_second=3000)
    pipeline.source(source).rebalance().map_batches(slow, name="enrich").sink(
        TwoPhaseCommitTestSink(os.environ["JOB_DIR"] + "/out"))
    """
)


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`sluice run job.py` in its own process, registered and checkpointing; yields (process, storage)."""
    (tmp_path / "job.py").write_text(JOB)
    env = {**os.environ, "JOB_DIR": str(tmp_path)}
    cmd = [sys.executable, "-m", "sluice.cli", "run", str(tmp_path / "job.py"), "--runtime", "local",
           "--restore", "none", "--progress-interval", "0.5"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    chk = str(tmp_path / "chk")
    try:
        wait_for("the job to run", lambda: [j for j in sluice_json("jobs", "--storage", chk) if j["last_checkpoint"]],
                 alive=lambda: proc.poll() is None)
        yield proc, chk
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_status_dashboard_errors_and_cancel(running: tuple[subprocess.Popen[str], str], tmp_path: Path) -> None:
    proc, chk = running
    # rates need two samples of the job's metrics: wait for them rather than for luck
    status = wait_for(
        "the sink's rate",
        lambda: (s := sluice_json("status", "verbs", "--storage", chk))["metrics"]["vertices"][1]["rates"].get(
            "sink_records_per_s"
        )
        and s,
        alive=lambda: proc.poll() is None,
    )
    assert status["job"]["status"] == "running" and status["job"]["runtime"] == "local"
    assert [v["name"] for v in status["metrics"]["vertices"]] == ["generator", "rebalance -> enrich -> test-sink"]
    table = sluice("status", "verbs", "--storage", chk).stdout
    assert "job verbs: running on the local runtime" in table and "backpressured" in table
    # the one job running there needs no id
    assert "job verbs: running on the local runtime" in sluice("status", "--storage", chk).stdout
    # a sink's out/s is what it writes (it emits nothing downstream), and each vertex shows its watermark
    sink_vertex = status["metrics"]["vertices"][1]
    assert sink_vertex["sink"] and sink_vertex["rates"]["sink_records_per_s"] > 0, sink_vertex["rates"]
    assert "watermark" in table and table.count(" UTC") == 2, table
    token_file = tmp_path / "chk" / "verbs" / "_control.token"
    printed = sluice("dashboard", "verbs", "--storage", chk)
    token = token_file.read_text()
    assert printed.stdout.startswith(f"{status['job']['url']}/login#code=") and token not in printed.stdout
    assert "one-time login code" in printed.stderr
    # with --url the registry is skipped, and the token must come from somewhere
    url = status["job"]["url"]
    no_env = {k: v for k, v in os.environ.items() if k != "SLUICE_CONTROL_TOKEN"}
    r = sluice("status", "--url", url, "--storage", "/nonexistent", check=False, env=no_env)
    assert r.returncode != 0 and "--token-file" in r.stderr
    assert sluice_json("status", "--url", url, "--token-file", str(token_file))
    assert sluice_json("status", "--url", url, env={**os.environ, "SLUICE_CONTROL_TOKEN": token})
    # clear errors, no tracebacks
    r = sluice("status", "nosuchjob", "--storage", chk, check=False)
    assert r.returncode == 1 and "no running job 'nosuchjob'" in r.stderr and "running there: verbs" in r.stderr
    assert "Traceback" not in r.stderr
    r = sluice("savepoint", "verbs", "--storage", chk, "--token-file", str(tmp_path / "job.py"), check=False)
    assert r.returncode == 1 and "does not hold a job token" in r.stderr
    (tmp_path / "wrong.token").write_text("x" * 43)
    r = sluice("savepoint", "verbs", "--url", url, "--token-file", str(tmp_path / "wrong.token"), check=False)
    assert r.returncode == 1 and "unauthorized" in r.stderr and "Traceback" not in r.stderr
    # through the registry, a token that did not sign the job's entry is not even sent
    r = sluice("savepoint", "verbs", "--storage", chk, "--token-file", str(tmp_path / "wrong.token"), check=False)
    assert r.returncode == 1 and "is not signed with the job's token" in r.stderr and "Traceback" not in r.stderr
    r = sluice("savepoint", "verbs", "--storage", chk, "--token-file", str(tmp_path / "missing"), check=False)
    assert r.returncode == 1 and "cannot read the job's token file" in r.stderr

    assert sluice_json("cancel", "verbs", "--storage", chk) == {"status": "cancelled", "attempts": 1}
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "cancelled" in out
    assert "read " in err and "verbs running (attempt 0" in err  # plain progress lines on stderr (not a TTY)
    assert token not in out + err
    assert "no running jobs registered" in sluice("jobs", "--storage", chk).stdout
    r = sluice("stop", "verbs", "--storage", chk, check=False)
    assert r.returncode == 1 and "is not running: it ended cancelled" in r.stderr


def test_live_progress_draws_a_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "160")  # the width of the terminal rich draws for
    p = Pipeline("live", parallelism=1, checkpoint=CheckpointConfig(interval=0.1, storage=str(tmp_path / "chk")))
    p.source(GeneratorSource(num_splits=1, records_per_split=10**7, batch_size=20, rows_per_second=2000)).sink(
        TwoPhaseCommitTestSink(str(tmp_path / "out"))
    )
    client = p.start(runtime="local", restore="none", control_endpoint=None)
    try:
        stream = io.StringIO()
        view = Progress(client.monitor, stream, live=True)
        view.start()
        wait_for("a checkpoint and rates", lambda: "checkpoint " in summary_line(client.monitor)
                 and client.monitor.rates())
        # the sink is chained behind the source (no exchange): its written rows still count
        wait_for("rows written", lambda: re.search(r"written [1-9]", summary_line(client.monitor)))
        view.refresh = 0.0
        view.tick()
        view.stop()
        drawn = stream.getvalue()
        assert "live" in drawn and "running" in drawn and "generator -> test-sink" in drawn
        assert "backpressured" in drawn and "checkpoint " in drawn and "/s" in drawn
    finally:
        client.cancel()


def test_stop_says_where_it_stopped_and_jobs_all_lists_the_ended_job(
    running: tuple[subprocess.Popen[str], str],
) -> None:
    """Before: `sluice run` summed up a stop as "last checkpoint 5" when it stopped at savepoint-6, and
    `sluice jobs --all` showed no attempt, run time or last checkpoint of a job that ended."""
    proc, chk = running
    r = sluice("stop", "verbs", "--storage", chk, "--savepoint", "--timeout", "0", check=False)
    assert r.returncode == 2 and "'--timeout': must be a duration > 0" in r.stderr
    stopped = sluice_json("stop", "verbs", "--storage", chk, "--savepoint")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    name = Path(stopped["stopped_at"]).name
    assert name.startswith("savepoint-")
    assert f"job verbs: stopped after 1 attempt(s) at {name}\n" in out and "last checkpoint" not in out
    (ended,) = sluice_json("jobs", "--storage", chk, "--all")
    assert ended["status"] == "stopped" and ended["attempt"] == 0 and ended["uptime_s"] > 0
    assert ended["last_checkpoint"] == int(name.removeprefix("savepoint-"))
    table = sluice("jobs", "--storage", chk, "--all").stdout
    (row,) = [line for line in table.splitlines() if line.strip().startswith("verbs")]
    assert row.split()[:4] == ["verbs", "stopped", "local", "0"] and f" {ended['last_checkpoint']} " in row
