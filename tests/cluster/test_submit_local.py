"""``spark-submit --master 'local[2]' job.py`` works without SPARK_LOCAL_IP.

Spark's local mode names its executor after the machine's address (on a host whose name resolves to
loopback it picks another interface), while the driver sits on loopback; slots used to bind one address
and advertise the other and failed every attempt. Now local mode keeps every sluice listener on loopback.
The job rebalances, so every record crosses a slot-to-slot link.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster.conftest import JOB, KafkaInput, visible_ids
from tests.kafka_broker import TansuBroker

pytestmark = [pytest.mark.cluster, pytest.mark.spark, pytest.mark.kafka]


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
