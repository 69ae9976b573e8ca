"""What a cluster can offer (sluice.runtime.spark.cluster), without Spark: refusals of clusters that can
never run a job, waiting for slots that will come, and the addresses listeners bind and advertise.
The driver's use of them on a real context is in test_spark_runtime.py and tests/cluster/."""

from __future__ import annotations

import logging
import socket
import threading

import pytest
from sluice.errors import ConfigError
from sluice.runtime.spark import SlotWaitTimeoutError, SparkOptions, check_cluster
from sluice.runtime.spark.cluster import (
    bind_address,
    driver_addresses,
    is_local_master,
    is_loopback,
    max_possible_slots,
    wait_for_slots,
)

pytestmark = pytest.mark.spark


@pytest.mark.parametrize(
    ("conf", "most"),
    [
        ({"spark.master": "local"}, 1),
        ({"spark.master": "local[3]"}, 3),
        ({"spark.master": "local[4,1]"}, 4),
        ({"spark.master": "local[4,1]", "spark.task.cpus": "2"}, 2),
        ({"spark.master": "local-cluster[2,3,1024]"}, 6),
        ({"spark.master": "spark://h:7077", "spark.cores.max": "3"}, 3),
        ({"spark.master": "spark://h:7077"}, None),  # grows with the workers that register
        ({"spark.master": "yarn", "spark.executor.instances": "2", "spark.executor.cores": "4"}, 8),
        ({"spark.master": "k8s://https://k:6443", "spark.executor.instances": "3"}, 3),
        ({"spark.master": "yarn"}, None),
    ],
)
def test_max_possible_slots(conf: dict[str, str], most: int | None) -> None:
    got = max_possible_slots(conf)
    assert (got[0] if got else None) == most


def test_only_clusters_that_can_never_fit_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"set spark.dynamicAllocation.enabled=false") as info:
        check_cluster({"spark.master": "spark://h:7077", "spark.dynamicAllocation.enabled": "true"}, 2, "j")
    assert "\n" not in str(info.value)
    with pytest.raises(
        ConfigError, match=r"needs 3 Spark task slot\(s\).*at most 2 \(spark.cores.max=2"
    ) as info:
        check_cluster({"spark.master": "spark://h:7077", "spark.cores.max": "2"}, 3, "j")
    assert "\n" not in str(info.value) and "lower the job's parallelism to 2" in str(info.value)
    with pytest.raises(ConfigError, match=r"spark.executor.instances=1 x spark.executor.cores=1"):
        check_cluster({"spark.master": "yarn", "spark.executor.instances": "1"}, 2, "j")
    with pytest.raises(ConfigError, match=r"spark.task.cpus must be an integer"):
        check_cluster({"spark.master": "local[2]", "spark.task.cpus": "x"}, 2, "j")
    # none registered yet is no reason to refuse: the driver waits for them
    check_cluster({"spark.master": "spark://h:7077"}, 8, "j")
    check_cluster({"spark.master": "spark://h:7077", "spark.cores.max": "8"}, 8, "j")


def test_waits_until_the_slots_are_offered(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sluice.spark")
    offers = iter([0, 1, 1, 2])
    assert wait_for_slots(lambda: next(offers), 2, 60, threading.Event(), "job 'j' attempt 1", poll=0.01)
    text = caplog.text
    assert "job 'j' attempt 1: waiting up to 60s (slot_wait_timeout) for 2 Spark task slot(s)" in text
    assert "offers 1 of 2" in text and "2 task slot(s) available" in text


def test_gives_up_after_slot_wait_timeout_and_stops_on_cancel() -> None:
    with pytest.raises(SlotWaitTimeoutError, match=r"offered 1 of the 2 .*for 0s \(slot_wait_timeout\)"):
        wait_for_slots(lambda: 1, 2, 0, threading.Event(), "job 'j' attempt 0")
    stop = threading.Event()
    stop.set()
    assert not wait_for_slots(lambda: 0, 2, 60, stop, "job 'j' attempt 0")
    assert wait_for_slots(lambda: 4, 2, 0, stop, "job 'j' attempt 0")  # offered at once: no wait


def test_slot_wait_timeout_option(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLUICE_SLOT_WAIT_TIMEOUT", raising=False)
    assert SparkOptions().resolved({}).slot_wait_timeout == 180.0
    assert SparkOptions().resolved({"spark.sluice.slotWaitTimeout": "12"}).slot_wait_timeout == 12.0
    monkeypatch.setenv("SLUICE_SLOT_WAIT_TIMEOUT", "7.5")
    assert SparkOptions().resolved({"spark.sluice.slotWaitTimeout": "12"}).slot_wait_timeout == 7.5
    assert SparkOptions(slot_wait_timeout=3).resolved({}).slot_wait_timeout == 3
    monkeypatch.setenv("SLUICE_SLOT_WAIT_TIMEOUT", "soon")
    with pytest.raises(
        ConfigError, match=r"slot_wait_timeout .* must be a number of seconds >= 0 \(got 'soon'\)"
    ):
        SparkOptions().resolved({})


def test_addresses() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("192.0.2.7") and not is_loopback("no-such-host.invalid")
    # a loopback address is bound as itself (nothing else could reach it); others on every interface
    assert bind_address("127.0.0.1") == "127.0.0.1"
    assert bind_address("127.0.0.2") == "127.0.0.2"
    assert bind_address("::1") == "::1"
    assert bind_address("192.0.2.7") == "0.0.0.0"
    assert bind_address("2001:db8::7") == "::"
    assert bind_address("executor-3.cluster.example") == "0.0.0.0"
    # local mode stays on loopback whatever Spark's driver host is
    assert driver_addresses({"spark.master": "local[2]", "spark.driver.host": "192.0.2.7"}, None) == (
        "127.0.0.1",
        "127.0.0.1",
    )
    cluster = {"spark.master": "spark://m:7077", "spark.driver.host": "192.0.2.7"}
    assert driver_addresses(cluster, None) == ("0.0.0.0", "192.0.2.7")
    assert driver_addresses(cluster, "gateway.example") == ("0.0.0.0", "gateway.example")
    assert driver_addresses({**cluster, "spark.driver.host": "127.0.0.1"}, None) == ("127.0.0.1", "127.0.0.1")
    assert is_local_master("local[2,1]") and not is_local_master("local-cluster[2,1,512]")


def test_bound_listener_serves_the_advertised_address() -> None:
    # the bug this replaces: bound on loopback, advertised on another interface (or the reverse)
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.connect(("192.0.2.1", 9))  # no packet sent: only picks the interface a peer would reach
    interface = probe.getsockname()[0]
    probe.close()
    for advertised in ("127.0.0.1", interface):
        bind = bind_address(advertised)
        server = socket.create_server((bind, 0))
        try:
            with socket.create_connection((advertised, server.getsockname()[1]), timeout=5):
                pass
        finally:
            server.close()
