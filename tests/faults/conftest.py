"""Fixtures of the fault tier beyond crashes: a fault proxy in front of moto's S3 server and in front of a
dedicated tansu broker, and a size-limited tmpfs. None of them skips: a part that cannot be had fails."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sluice.templates.broker import _free_port

from tests.faults.beyond import Output
from tests.faults.disk import SmallDisk
from tests.faults.proxy import FaultProxy
from tests.kafka_broker import TansuBroker
from tests.sinks.conftest import CREDS, MotoS3


@dataclass
class ProxiedS3:
    """moto's S3 server reached through ``proxy``: jobs use :meth:`options`, the test's own checks use
    ``direct`` (which no fault touches)."""

    direct: MotoS3
    proxy: FaultProxy

    def options(self) -> dict[str, Any]:
        """S3 client options through the proxy (everything else as a user would leave it)."""
        return {"endpoint_url": f"http://{self.proxy.address}", **CREDS}

    def output(self, kind: str, local: str) -> Output:
        """A sink of ``kind`` writing to a new bucket through the proxy, read back directly."""
        bucket = self.direct.new_bucket()
        return Output(
            kind, f"s3://{bucket}/run", self.options(), reader_fs=self.direct.arrow_fs(),
            reader_options=self.direct.options(), local=local,
        )  # fmt: skip


@pytest.fixture
def s3_proxy(moto_s3: MotoS3) -> Iterator[ProxiedS3]:
    with FaultProxy(("127.0.0.1", moto_s3.port)) as proxy:
        yield ProxiedS3(moto_s3, proxy)


class ProxiedBroker(TansuBroker):
    """A tansu broker that advertises the proxy's address: Kafka clients learn broker addresses from
    metadata, so every connection (bootstrap and after) goes through the proxy. The test's own producer and
    admin client use it too: produce before cutting."""

    def __init__(self, proxy: FaultProxy) -> None:
        super().__init__()
        self.proxy = proxy

    @property
    def bootstrap(self) -> str:
        if self._port is None:
            raise RuntimeError("ProxiedBroker is not started")
        return self.proxy.address

    def _launch(self, binary: Path) -> None:
        # LocalBroker._launch with the advertised listener on the proxy's port
        self._port = _free_port()
        self.proxy.set_upstream("127.0.0.1", self._port)
        cmd = [
            str(binary), "broker",
            "--listener-url", f"tcp://127.0.0.1:{self._port}",
            "--advertised-listener-url", f"tcp://{self.proxy.address}",
            "--storage-engine", "memory://tansu/",
        ]  # fmt: skip
        drop = {"CLUSTER_ID", "LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE", "SCHEMA_REGISTRY"}
        env = {k: v for k, v in os.environ.items() if k not in drop and k != "OTEL_EXPORTER_OTLP_ENDPOINT"}
        env["NO_COLOR"] = "1"
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
        self._wait_ready()


@pytest.fixture
def broker_proxy() -> Iterator[ProxiedBroker]:
    """A fresh tansu broker behind a fault proxy (``.proxy``); fails if it cannot start."""
    with FaultProxy() as proxy:
        b = ProxiedBroker(proxy)
        b.start()
        try:
            yield b
        finally:
            # tansu waits 5 s for open connections before it obeys SIGTERM, and a finished job may leave a
            # client connected until it is garbage-collected: close them first
            proxy.cut()
            b.stop()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[[str], SmallDisk]]:
    """``small_disk("64m")`` mounts a tmpfs of that size (under tmp_path) and returns it; unmounted at the
    end of the test. Fails (never skips) if it cannot mount."""
    disks: list[SmallDisk] = []

    def make(size: str) -> SmallDisk:
        d = SmallDisk(tmp_path / f"disk{len(disks)}", size).mount()
        disks.append(d)
        return d

    try:
        yield make
    finally:
        for d in disks:
            d.unmount()
