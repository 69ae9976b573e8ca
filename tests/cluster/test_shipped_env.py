"""Shipping the job's environment: a fresh virtualenv with sluice installed from its wheel (every dependency
from the package index), packed by ``sluice package``, submitted with the line it prints; the executors
run the unpacked archive's Python and sluice, not the driver's virtualenv (nor this checkout's).

Slow (installs every dependency into a new virtualenv and ships a ~200 MB archive), so ``-m cluster``
only; tests/cli/test_package.py is the cheap half in the default run.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster.conftest import JOB, KafkaInput, result_of, visible_ids
from tests.cluster.standalone import StandaloneCluster
from tests.kafka_broker import TansuBroker

_PLAIN = "plain records read to explicit stops from the fetched end (high_watermark.py); no transactions"
pytestmark = [pytest.mark.cluster, pytest.mark.soak, pytest.mark.spark, pytest.mark.kafka, pytest.mark.tansu("Spark cluster failures: " + _PLAIN)]

ROOT = Path(__file__).resolve().parent.parent.parent


def _sh(*cmd: str, cwd: Path) -> str:
    r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=1200, cwd=cwd)
    assert r.returncode == 0, f"{' '.join(cmd)}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


def test_job_runs_on_the_packed_environment(
    cluster: StandaloneCluster, broker: TansuBroker, tmp_path: Path, sluice_wheel: Path
) -> None:
    wheel = sluice_wheel
    job_env = tmp_path / "job-env"
    _sh(sys.executable, "-m", "venv", str(job_env), cwd=tmp_path)
    _sh(str(job_env / "bin" / "pip"), "install", "-q", str(wheel), cwd=tmp_path)
    line = _sh(
        str(job_env / "bin" / "sluice"), "package", "-o", "env.tar.gz", "--master", cluster.url, JOB, cwd=tmp_path
    ).strip()
    words = shlex.split(line)
    env = dict(w.split("=", 1) for w in words[:2])
    assert env == {"PYSPARK_DRIVER_PYTHON": f"{job_env}/bin/python", "PYSPARK_PYTHON": "./environment/bin/python"}
    archives = words[words.index("--archives") + 1]
    assert archives == f"{tmp_path / 'env.tar.gz'}#environment" and words[-1] == JOB

    data = KafkaInput(broker, f"shipped-{os.urandom(3).hex()}", per_partition=200)
    data.rest()
    driver = cluster.submit("shipped-env", JOB, *data.job_args(tmp_path), "--who", env=env, archives=archives)
    result = result_of(driver)
    assert result["status"] == "finished" and visible_ids(tmp_path / "table") == data.ids
    # every slot logged (through the driver) the Python and the sluice it runs
    who = re.findall(r"\[slot (\d)\] \[[^]]+\] executor python (\S+) sluice (\S+)", driver.log.read_text())
    assert {slot for slot, _, _ in who} == {"0", "1"}, driver.log_tail()
    for _, python, sluice in who:
        assert python.startswith(str(cluster.base)) and python.endswith("/environment/bin/python"), python
        assert sluice.startswith(str(cluster.base)) and "/environment/lib/python3" in sluice, sluice
        assert not sluice.startswith((str(ROOT), str(job_env), sys.prefix)), sluice
