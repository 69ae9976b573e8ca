"""Fixtures of the fault tier beyond crashes: a fault proxy in front of moto's S3 server and in front of a
dedicated tansu broker, and a size-limited tmpfs. None of them skips: a part that cannot be had fails."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

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


@dataclass
class ProxiedBroker:
    """A tansu broker reached only through a :class:`FaultProxy`: it advertises the proxy's address, and
    Kafka clients learn broker addresses from metadata, so every connection after the bootstrap goes through
    the proxy. ``proxy.cut()`` is a broker outage as clients see it; the data survives it (the broker process
    keeps running). ``broker`` (its bootstrap is direct) creates topics and produces."""

    broker: TansuBroker
    proxy: FaultProxy

    @property
    def bootstrap(self) -> str:
        """The address jobs are given: the proxy's."""
        return self.proxy.address


@pytest.fixture
def proxied_broker() -> Iterator[ProxiedBroker]:
    """A fresh tansu broker behind a fault proxy (fails, never skips, if it cannot start)."""
    proxy = FaultProxy().start()
    broker = TansuBroker()
    broker.advertised_port = proxy.port
    try:
        broker.start()
        proxy.set_upstream("127.0.0.1", int(broker.bootstrap.rsplit(":", 1)[1]))
        yield ProxiedBroker(broker, proxy)
    finally:
        # tansu waits 5 s for open connections before it obeys SIGTERM, and a finished job may leave a
        # client connected until it is garbage-collected: close them first
        proxy.cut()
        broker.stop()
        proxy.stop()


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
