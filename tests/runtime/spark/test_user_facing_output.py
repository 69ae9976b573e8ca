"""What a user of the Spark runtime sees on the terminal: causes from the executors, short results, no banner.

* An executor that cannot start Python (``Cannot run program "./environment/bin/python"``, the cause that
  only Spark's log4j output named) fails the job at once with that cause in one line; sluice used to say
  "barrier task finished unsuccessfully" after 4 attempts, with a traceback.
* A job from ``sluice new`` run with spark-submit prints one line of result, not the JobResult's repr.
* ``sluice run`` on the Spark runtime keeps the JVM's start-up banner off stderr unless ``-v``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from sluice.cli import main
from sluice.runtime.spark.driver import executor_cause

pytestmark = pytest.mark.spark

BIN = Path(sys.executable).parent
BANNER = ("Using incubator modules", "Setting default log level", "To adjust logging level")


def _job(tmp: Path) -> Path:
    r = CliRunner().invoke(main, ["new", "totals", "--template", "generator-to-parquet", "--dir", str(tmp)])
    assert r.exit_code == 0, r.output
    return tmp / "totals.py"


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
    env.update(OUTPUT_PATH=str(tmp / "out"), CHECKPOINT_PATH=str(tmp / "chk"), **extra)
    return env


def _submit(tmp: Path, python: str) -> subprocess.CompletedProcess[str]:
    cmd = [str(BIN / "spark-submit"), "--master", "local[2]", str(_job(tmp))]
    env = _env(tmp, PYSPARK_DRIVER_PYTHON=sys.executable, PYSPARK_PYTHON=python)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp)


def test_an_executor_that_cannot_start_python_is_one_line_and_fails_at_once(tmp_path: Path) -> None:
    r = _submit(tmp_path, "./missing/bin/python")
    assert r.returncode == 1, r.stdout + r.stderr[-3000:]
    # spark-submit sends the Python driver's stdout and stderr to its stdout; its own log4j lines (its
    # default profile) go to stderr
    assert "Traceback" not in r.stdout, r.stdout[-5000:]
    (last,) = [ln for ln in r.stdout.splitlines() if ln.startswith("totals: ")]
    assert last.startswith("totals: job 'totals' failed at once"), last
    assert 'the executors cannot start Python (java.io.IOException: Cannot run program "./missing/bin/python"' in last
    assert "finished unsuccessfully" not in last and "attempt 1:" not in r.stdout, r.stdout


def test_a_template_job_prints_a_short_result(tmp_path: Path) -> None:
    r = _submit(tmp_path, sys.executable)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    assert lines[-1].startswith("job totals: finished after 1 attempt(s); last checkpoint "), r.stdout[-3000:]
    assert r.stdout.count("finished after") == 1, r.stdout[-3000:]  # the template's own line, once
    assert "JobResult(" not in r.stdout and len(lines[-1]) < 100, r.stdout[-3000:]


def test_sluice_run_keeps_the_jvm_banner_off_stderr_unless_verbose(tmp_path: Path) -> None:
    job = _job(tmp_path)
    for verbose, args in ((False, []), (True, ["-v"])):
        cmd = [str(BIN / "sluice"), *args, "run", str(job), "--no-progress", "--restore", "none"]
        run_dir = tmp_path / ("verbose" if verbose else "quiet")  # each run its own output and checkpoints
        run_dir.mkdir()
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=_env(run_dir), cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-3000:]
        shown = [b for b in BANNER if b in r.stderr]
        if verbose:
            assert shown, r.stderr[-3000:]
        else:
            assert not shown, r.stderr
            assert len(r.stderr.strip().splitlines()) == 1 and "control endpoint" in r.stderr, r.stderr


def test_executor_cause_prefers_the_python_exception_over_its_wrappers() -> None:
    text = (
        "An error occurred while calling o84.collectAndServe.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: Could not recover from a failed "
        "barrier ResultStage. Most recent failure reason: Stage failed because barrier task ResultTask(0, 1) "
        "finished unsuccessfully.\n"
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "/x/pyspark/worker.py", line 1, in main\n'
        "    func = read_command(pickleSer, infile)\n"
        "ModuleNotFoundError: No module named 'sluice'\n"
        "\n\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(PythonRunner.scala:1)\n"
        "Caused by: java.io.EOFException\n"
    )
    assert executor_cause(text) == "ModuleNotFoundError: No module named 'sluice'"
    java = text.replace("org.apache.spark.api.python.PythonException: Traceback", "java.io.IOException: Broken pipe\nx")
    java = java.replace("ModuleNotFoundError: No module named 'sluice'\n", "")
    assert executor_cause(java) == "java.io.IOException: Broken pipe"
    assert executor_cause("org.apache.spark.SparkException: Job aborted") is None


def test_executor_cause_keeps_sparks_own_messages_that_are_causes() -> None:
    crashed = (
        ": org.apache.spark.SparkException: Job aborted due to stage failure: barrier task finished unsuccessfully.\n"
        "org.apache.spark.SparkException: Python worker exited unexpectedly (crashed)\n"
        "\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.read(PythonRunner.scala:1)\n"
        "Caused by: java.io.EOFException\n"
    )
    assert executor_cause(crashed) == "org.apache.spark.SparkException: Python worker exited unexpectedly (crashed)"
