"""``spark-submit --master 'local[2]' job.py`` works without SPARK_LOCAL_IP, and with the line ``sluice package``
prints.

Spark's local mode names its executor after the machine's address (on a host whose name resolves to
loopback it picks another interface), while the driver sits on loopback; slots used to bind one address
and advertise the other and failed every attempt. Now local mode keeps every sluice listener on loopback.
The job rebalances, so every record crosses a slot-to-slot link.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster.conftest import JOB, KafkaInput, visible_ids
from tests.fresh_venv import dependencies, new_venv, run
from tests.kafka_broker import TansuBroker

_PLAIN = "plain records read to explicit stops from the fetched end (high_watermark.py); no transactions"
pytestmark = [pytest.mark.cluster, pytest.mark.spark, pytest.mark.kafka, pytest.mark.tansu("Spark cluster failures: " + _PLAIN)]


def test_spark_submit_local_without_spark_local_ip(broker: TansuBroker, tmp_path: Path) -> None:
    data = KafkaInput(broker, f"submit-local-{os.urandom(3).hex()}", per_partition=400)
    data.rest()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
    env["PYSPARK_PYTHON"] = sys.executable
    cmd = [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2]", JOB]
    cmd += [*data.job_args(tmp_path), "--rebalance"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-5000:]
    result = [ln for ln in r.stdout.splitlines() if ln.startswith("SLUICE_RESULT ")]
    assert result and '"status": "finished", "attempts": 1,' in result[-1], out[-5000:]
    assert visible_ids(tmp_path / "table") == data.ids


def test_the_line_sluice_package_prints_runs_on_a_local_master(
    broker: TansuBroker, tmp_path: Path, sluice_wheel: Path
) -> None:
    """`sluice package` then its spark-submit line with ``--master 'local[2]'``: local executors start
    Python in the driver's working directory, where ``./environment/bin/python`` is not; the driver points
    them at the archive Spark unpacked (it failed 4 attempts with "barrier task finished unsuccessfully")."""
    job_env = tmp_path / "job-env"
    new_venv(job_env, sluice_wheel, dependencies(tmp_path / "deps"))
    line = run([str(job_env / "bin" / "sluice"), "package", "-o", "env.tar.gz", "--master", "local[2]", JOB], tmp_path)
    words = shlex.split(line.strip())
    assert words[:2] == [f"PYSPARK_DRIVER_PYTHON={job_env}/bin/python", "PYSPARK_PYTHON=./environment/bin/python"]
    assert words[words.index("--archives") + 1] == f"{tmp_path / 'env.tar.gz'}#environment"

    data = KafkaInput(broker, f"package-local-{os.urandom(3).hex()}", per_partition=200)
    data.rest()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_", "VIRTUAL_ENV"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # spark-submit
    cmd = " ".join([line.strip(), *(shlex.quote(a) for a in data.job_args(tmp_path)), "--who"])
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-5000:]
    result = [ln for ln in r.stdout.splitlines() if ln.startswith("SLUICE_RESULT ")]
    assert result and '"status": "finished", "attempts": 1,' in result[-1], out[-5000:]
    assert visible_ids(tmp_path / "table") == data.ids
    # the executors ran the unpacked archive's Python and sluice, not the job's virtualenv
    who = re.findall(r"executor python (\S+) sluice (\S+)", out)
    assert who, out[-5000:]
    for python, sluice in who:
        assert python.endswith("/environment/bin/python") and not python.startswith(str(job_env)), python
        assert "/environment/lib/python3" in sluice and not sluice.startswith(str(job_env)), sluice
