"""Fixtures of the Kafka connector tests (``broker`` and ``topic`` are shared, in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.kafka.proxy import TcpProxy, free_port
from tests.kafka.registry_server import RecordedSchemaRegistry
from tests.kafka_broker import TansuBroker


@pytest.fixture
def registry() -> Iterator[RecordedSchemaRegistry]:
    """A schema registry on loopback replaying recorded exchanges; fails the test on unrecorded requests."""
    reg = RecordedSchemaRegistry().start()
    try:
        yield reg
    finally:
        reg.stop()
    assert not reg.unmatched, f"requests the recorded registry cannot answer: {reg.unmatched}"


@dataclass
class ProxiedBroker:
    """A tansu broker reached only through a :class:`TcpProxy` (its advertised address): ``proxy.cut()``
    is a broker outage as clients see it; the data survives it (the broker process keeps running)."""

    broker: TansuBroker
    proxy: TcpProxy

    @property
    def bootstrap(self) -> str:
        """The address clients are given: the proxy's."""
        return f"127.0.0.1:{self.proxy.port}"


@pytest.fixture
def proxied_broker() -> Iterator[ProxiedBroker]:
    """A fresh tansu broker behind a fault proxy (fails, never skips, if it cannot start)."""
    port = free_port()
    broker = TansuBroker()
    broker.advertised_port = port
    broker.start()
    proxy = TcpProxy(("127.0.0.1", int(broker.bootstrap.rsplit(":", 1)[1])), port).start()
    try:
        yield ProxiedBroker(broker, proxy)
    finally:
        proxy.stop()
        broker.stop()
