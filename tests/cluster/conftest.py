"""Fixtures of the cluster tier: a standalone Spark cluster on loopback and helpers to run the Kafka ->
Parquet job on it, watch it and check its output.

Markers: every test here is ``cluster``; the long ones are also ``soak`` (not in the default run). So the
default run has a fast slice, ``-m cluster`` runs the whole tier and ``-m soak`` the long ones.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from tests.cluster.standalone import Proc, StandaloneCluster
from tests.connectors.kafka.helpers import json_values
from tests.kafka_broker import TansuBroker
from tests.sinks.conftest import FINAL

JOB = str(Path(__file__).resolve().parent / "kafka_job.py")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A master and two workers (1 core each, separate JVMs) on 127.0.0.1; no process left afterwards."""
    c = StandaloneCluster(tmp_path_factory.mktemp("standalone"))
    try:
        c.start(workers=2)
        yield c
    finally:
        orphans = c.stop()
        assert not orphans, f"processes left behind by the cluster:\n{c.orphan_report}"


def wait_for(what: str, predicate: Callable[[], bool], driver: Proc | None = None, limit_s: float = 300) -> None:
    """Poll until ``predicate`` holds; a generous limit that only catches hangs, not a timing assertion."""
    deadline = time.monotonic() + limit_s
    while not predicate():
        if driver is not None and not driver.alive():
            raise AssertionError(f"the job ended before {what}:\n{driver.log_tail()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {limit_s}s" + (f"\n{driver.log_tail()}" if driver else ""))
        time.sleep(0.3)


def visible_ids(table: Path) -> list[int]:
    """The ids a reader sees (pyarrow.dataset skips hidden files): only final files, no id twice."""
    if not table.exists():
        return []
    dataset = ds.dataset(str(table), format="parquet")
    if not dataset.files:
        return []
    for f in dataset.files:
        assert FINAL.match(f.rsplit("/", 1)[-1]), f"a reader sees a non-final file: {f}"
    ids = sorted(dataset.to_table(columns=["id"]).column("id").to_pylist())
    assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} ids visible twice"
    return ids


def result_of(driver: Proc, limit_s: float = 600) -> dict[str, object]:
    """Wait for a spark-submit driver to exit and return its ``SLUICE_RESULT``."""
    try:
        driver.popen.wait(limit_s)
    except Exception as exc:
        raise AssertionError(f"the job did not end within {limit_s}s:\n{driver.log_tail()}") from exc
    lines = [ln for ln in driver.log.read_text(errors="replace").splitlines() if ln.startswith("SLUICE_RESULT ")]
    assert driver.popen.returncode == 0 and lines, f"the job failed:\n{driver.log_tail(120)}"
    return json.loads(lines[-1].split(" ", 1)[1])  # type: ignore[no-any-return]


@dataclass
class KafkaInput:
    """Two partitions of JSON records: the first half produced at once, the rest when the test says.
    The job's stopping offsets cover both halves, so it cannot finish before the second half exists:
    a fault injected before that always hits a running job."""

    broker: TansuBroker
    topic: str
    per_partition: int = 1500

    def __post_init__(self) -> None:
        self.broker.create_topic(self.topic, 2)
        self._produce(0)

    def _produce(self, half: int) -> None:
        n = self.per_partition // 2
        for p in (0, 1):
            start = p * self.per_partition + half * n
            self.broker.produce(self.topic, json_values(n, start, p), partition=p)

    def rest(self) -> None:
        self._produce(1)
        assert self.broker.end_offsets(self.topic) == self.ends

    @property
    def ends(self) -> dict[int, int]:
        return {0: self.per_partition // 2 * 2, 1: self.per_partition // 2 * 2}

    @property
    def ids(self) -> list[int]:
        n = self.per_partition // 2 * 2
        return sorted(i for p in (0, 1) for i in range(p * self.per_partition, p * self.per_partition + n))

    def job_args(self, out: Path) -> list[str]:
        return [self.broker.bootstrap, self.topic, json.dumps(self.ends), str(out)]
