"""Fixtures of the Kafka connector tests: ``broker`` and ``topic`` are shared, in tests/conftest.py."""
