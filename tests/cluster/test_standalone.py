"""Exactly-once on a real standalone cluster (a master and two workers, separate JVMs on loopback), jobs
submitted with spark-submit in client mode: Kafka -> Parquet while (a) an executor JVM is SIGKILLed,
(b) a whole worker is killed and a new one started, (c) the driver is killed and the job submitted again.

Each fault is injected while the job is running (it cannot finish: half of its input is produced only
after the fault) and after it committed output; right after the fault a reader sees only complete,
final files; in the end the output equals the input, every id once, and no process of the job is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster.conftest import JOB, KafkaInput, result_of, visible_ids, wait_for
from tests.cluster.standalone import Proc, StandaloneCluster
from tests.faults.shapes import record
from tests.kafka_broker import TansuBroker

_PLAIN = "plain records read to explicit stops from the fetched end (high_watermark.py); no transactions"
pytestmark = [pytest.mark.cluster, pytest.mark.spark, pytest.mark.kafka, pytest.mark.tansu("Spark cluster failures: " + _PLAIN)]


def _start(cluster: StandaloneCluster, broker: TansuBroker, tmp_path: Path, name: str) -> tuple[KafkaInput, Proc]:
    data = KafkaInput(broker, f"{name}-{os.urandom(3).hex()}")
    driver = cluster.submit(name, JOB, *data.job_args(tmp_path))
    return data, driver


def _running_with_output(cluster: StandaloneCluster, driver: Proc, name: str, table: Path) -> str:
    """Wait until the job's executors run and a checkpoint committed output; returns the app id."""
    wait_for("the application registered", lambda: cluster.app_id(name) is not None, driver)
    app = cluster.app_id(name)
    assert app is not None
    wait_for("a checkpoint committed output", lambda: len(visible_ids(table)) > 0, driver)
    return app


def _finish(
    cluster: StandaloneCluster, data: KafkaInput, driver: Proc, table: Path, scenario: str, fired: bool
) -> dict[str, object]:
    """Produce the rest, wait for the job, compare its output with the input; no process of it left."""
    seen = visible_ids(table)  # right after the fault: complete final files only, nothing twice
    assert len(seen) < len(data.ids), "the job had read input it was not given yet"
    data.rest()
    result = result_of(driver)
    got = visible_ids(table)
    record("cluster", scenario, "kafka-parquet", "aligned", fired, 1, got, data.ids)
    assert got == data.ids, f"{len(got)} ids visible, expected {len(data.ids)}"
    left = cluster.wait_gone(keep=cluster.daemons())
    assert not left, f"processes of the job left behind:\n{cluster.describe(left)}"
    return result


def test_executor_jvm_killed_mid_run(cluster: StandaloneCluster, broker: TansuBroker, tmp_path: Path) -> None:
    name = "kill-executor"
    data, driver = _start(cluster, broker, tmp_path, name)
    table = tmp_path / "table"
    app = _running_with_output(cluster, driver, name, table)
    executors = cluster.executors(app)
    assert len(executors) == 2, cluster.describe(executors)
    os.kill(executors[0], signal.SIGKILL)
    assert driver.alive(), "the fault did not hit a running job"
    result = _finish(cluster, data, driver, table, "kill-executor-jvm", True)
    assert result["status"] == "finished"
    assert int(result["attempts"]) >= 2, f"the job did not restart: {result}"  # type: ignore[call-overload]


@pytest.mark.soak
def test_worker_killed_and_replaced(cluster: StandaloneCluster, broker: TansuBroker, tmp_path: Path) -> None:
    name = "kill-worker"
    data, driver = _start(cluster, broker, tmp_path, name)
    table = tmp_path / "table"
    app = _running_with_output(cluster, driver, name, table)
    before = set(cluster.executors(app))
    victim = cluster.workers[0]
    cluster.kill_worker(victim)  # the worker JVM and its executor JVM (one process group)
    wait_for("the killed worker's executor is gone", lambda: len(set(cluster.executors(app)) & before) < 2)
    assert driver.alive(), "the fault did not hit a running job"
    cluster.start_worker()
    cluster.wait_workers(2)
    result = _finish(cluster, data, driver, table, "kill-worker", True)
    assert result["status"] == "finished"
    assert int(result["attempts"]) >= 2, f"the job did not restart: {result}"  # type: ignore[call-overload]


@pytest.mark.soak
def test_driver_killed_and_job_submitted_again(
    cluster: StandaloneCluster, broker: TansuBroker, tmp_path: Path
) -> None:
    name = "kill-driver"
    data, driver = _start(cluster, broker, tmp_path, name)
    table = tmp_path / "table"
    _running_with_output(cluster, driver, name, table)
    assert driver.alive(), "the fault did not hit a running job"
    driver.kill_group()  # spark-submit's JVM and the Python driver in it
    partial = visible_ids(table)
    assert 0 < len(partial) < len(data.ids)
    # the master ends the application: its executors and Python workers go away
    left = cluster.wait_gone(keep=cluster.daemons())
    assert not left, f"the killed driver's processes are left:\n{cluster.describe(left)}"
    again = cluster.submit(name, JOB, *data.job_args(tmp_path))  # same job: resumes its latest checkpoint
    wait_for("the resubmitted application registered", lambda: cluster.app_id(name) is not None, again)
    result = _finish(cluster, data, again, table, "kill-driver", True)
    assert result["status"] == "finished"


def test_python_cluster_deploy_mode_is_not_supported_by_standalone(
    cluster: StandaloneCluster, tmp_path: Path
) -> None:
    # documented in docs/spark.md: on standalone, a Python job's driver runs where spark-submit runs
    r = subprocess.run(
        [str(Path(sys.executable).parent / "spark-submit"), "--master", cluster.url, "--deploy-mode", "cluster", JOB],
        capture_output=True, text=True, timeout=300, env=cluster.env(), cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode != 0
    assert "Cluster deploy mode is currently not supported for python applications on standalone" in (
        r.stdout + r.stderr
    )
