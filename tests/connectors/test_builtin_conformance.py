"""The conformance kit passes for every built-in connector: the generator and Kafka sources (the Kafka
source on Apache Kafka, tests/apache_kafka.py), the file sink on local disk (plain and compacting) and on S3 (moto), the test sink (per-subtask
and global commit), the Delta and Iceberg table sinks. Cases are in tests/connectors/cases.py."""

from __future__ import annotations

from sluice.testing.conformance import SinkConformance, SourceConformance


class TestBuiltinSources(SourceConformance):
    """Every source check against every case of SOURCE_CASES (fixture ``source_case``)."""


class TestBuiltinSinks(SinkConformance):
    """Every sink check against every case of SINK_CASES (fixture ``sink_case``)."""
