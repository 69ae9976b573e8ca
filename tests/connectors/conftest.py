"""Fixtures of the conformance-kit tests: the built-in connectors as cases (tests/connectors/cases.py)."""

from __future__ import annotations

import pytest
from sluice.testing.conformance import SinkCase, SourceCase

from tests.connectors.cases import (  # noqa: F401 - fixtures
    APACHE_KAFKA_CASES,
    SINK_CASES,
    SOURCE_CASES,
    delta_table,
    file_sink_compacting,
    file_sink_local,
    file_sink_s3,
    generator_source,
    iceberg_table,
    kafka_sink,
    kafka_source,
    kafka_source_native,
    postgres_append,
    postgres_upsert,
    test_sink,
    test_sink_global,
)


def _params(cases: list[str]) -> list[object]:
    return [pytest.param(c, marks=pytest.mark.apache_kafka) if c in APACHE_KAFKA_CASES else c for c in cases]


@pytest.fixture(params=_params(SOURCE_CASES), scope="module")
def source_case(request: pytest.FixtureRequest) -> SourceCase:
    case: SourceCase = request.getfixturevalue(request.param)
    return case


@pytest.fixture(params=_params(SINK_CASES))
def sink_case(request: pytest.FixtureRequest) -> SinkCase:
    case: SinkCase = request.getfixturevalue(request.param)
    return case
