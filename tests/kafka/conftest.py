"""Fixtures of the Kafka connector tests: one real tansu broker per session (never skipped)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import pytest

from tests.kafka.registry_server import RecordedSchemaRegistry
from tests.kafka_broker import TansuBroker

_names = itertools.count()


@pytest.fixture(scope="session")
def broker() -> Iterator[TansuBroker]:
    """A memory-backed tansu broker; fails (does not skip) if it cannot start."""
    b = TansuBroker()
    b.start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def topic(broker: TansuBroker, request: pytest.FixtureRequest) -> Callable[..., str]:
    """``topic(partitions=n)`` creates a fresh, uniquely named topic and returns its name."""

    def make(partitions: int = 1) -> str:
        name = f"{request.node.name.split('[')[0][:40]}-{next(_names)}".replace("_", "-")
        broker.create_topic(name, partitions)
        return name

    return make


@pytest.fixture
def registry() -> Iterator[RecordedSchemaRegistry]:
    """A schema registry on loopback replaying recorded exchanges; fails the test on unrecorded requests."""
    reg = RecordedSchemaRegistry().start()
    try:
        yield reg
    finally:
        reg.stop()
    assert not reg.unmatched, f"requests the recorded registry cannot answer: {reg.unmatched}"
