"""Fixtures of the Kafka connector tests (``broker`` and ``topic`` are shared, in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.connectors.kafka.registry_server import RecordedSchemaRegistry
from tests.faults.conftest import ProxiedBroker, proxied_broker  # the broker behind a fault proxy

__all__ = ["ProxiedBroker", "proxied_broker", "registry"]


@pytest.fixture
def registry() -> Iterator[RecordedSchemaRegistry]:
    """A schema registry on loopback replaying recorded exchanges; fails the test on unrecorded requests."""
    reg = RecordedSchemaRegistry().start()
    try:
        yield reg
    finally:
        reg.stop()
    assert not reg.unmatched, f"requests the recorded registry cannot answer: {reg.unmatched}"
