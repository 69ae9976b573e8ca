"""Fixtures of the Kafka sink tests: the recorded schema registry of the Kafka source's tests."""

from tests.connectors.kafka.conftest import registry  # noqa: F401 - fixture
