"""The public surface is pinned: a name leaves or joins a package's ``__all__`` only with this test.

As httpx's ``tests/test_exported_members.py``: each user-facing package's ``__all__`` is listed here, every
name in any module's ``__all__`` exists, and every module declares one (the layout's promise that a reader
finds the public names of ``sluice.x.y`` at the top of ``<root>/sluice/x/y.py``).
"""

from __future__ import annotations

import importlib
import pkgutil

import pytest
import sluice

PUBLIC = {
    "sluice": [
        "BadRecordError", "CheckpointConfig", "CheckpointError", "CheckpointFailureReason", "CommitError",
        "ConfigError", "ExponentialBackoffRestart", "FailureRateRestart", "FixedDelayRestart", "GraphError",
        "JobClient", "JobFailedError", "JobResult", "JobStatus", "KeyedContext", "KeyedProcessFunction",
        "KeyedStream", "ListStateDescriptor", "MapStateDescriptor", "NoRestart", "Pipeline", "RestartStrategy",
        "RestoreError", "RuntimeContext", "SluiceError", "Stream", "TimerService", "UserFunctionError",
        "ValueStateDescriptor", "__version__",
    ],
    "sluice.source": [
        "Boundedness", "EnumeratorContext", "InputStatus", "ReaderContext", "ReaderOutput", "Source",
        "SourceReader", "SourceSplit", "SplitEnumerator",
    ],
    "sluice.sink": [
        "CommitOutcome", "CommittableWithLineage", "Committer", "Compactor", "GlobalCommitter",
        "GlobalCommitterContext", "Sink", "SinkContext", "SinkWriter",
    ],
    "sluice.connectors": [
        "Boundedness", "EnumeratorContext", "InputStatus", "ReaderContext", "ReaderOutput", "Source",
        "SourceReader", "SourceSplit", "SplitEnumerator", "load_connector",
    ],
    "sluice.sinks": [
        "CommitOutcome", "Committer", "Compactor", "GlobalCommitter", "GlobalCommitterContext", "Sink",
        "SinkContext", "SinkWriter", "load_sink",
    ],
    "sluice.connectors.kafka": [
        "IncompatibleSchemaError", "KafkaDataLossError", "KafkaSource", "KafkaSourceError", "OffsetsInitializer",
        "SchemaNotFoundError", "SchemaRegistry", "SchemaRegistryError", "UnsupportedSchemaError",
    ],
    "sluice.sinks.files": [
        "CompactionPolicy", "FileCommittable", "FileSink", "RollingPolicy", "SchemaMismatchError", "StorageError",
    ],
    "sluice.sinks.delta": ["DeltaSink", "RewritePolicy", "TableLineageError", "TableSchemaError"],
    "sluice.sinks.iceberg": ["IcebergSink", "RewritePolicy", "TableLineageError", "TableSchemaError"],
    "sluice.sinks.tables": ["RewritePolicy", "TableFile", "TableLineageError", "TableSchemaError"],
    "sluice.windows": [
        "LATE", "Agg", "Session", "Sliding", "Tumbling", "WindowAssigner", "WindowedStream", "agg", "count",
        "count_distinct", "first", "last", "max", "mean", "min", "sum",
    ],
    "sluice.testing": ["POINTS", "FaultInjector", "InjectedFault", "SlotCrash", "SparkFaultInjector"],
    "sluice.testing.conformance": [
        "RECOVERY_STEPS", "SINK_CHECKS", "SINK_CONTRACTS", "SOURCE_CHECKS", "SOURCE_CONTRACTS", "ConformanceError",
        "SinkCase", "SinkConformance", "SinkTarget", "SourceCase", "SourceConformance", "check_abort_uncommitted",
        "check_bounded_end_of_input", "check_commit_idempotent", "check_enumerator_restore",
        "check_every_split_read_once", "check_failed_reader_reassignment", "check_no_record_after_stop",
        "check_nothing_visible_before_commit", "check_one_global_commit_per_checkpoint", "check_reader_restore",
        "check_recover_after_crash", "check_rescale", "check_sink_in_a_job", "check_sink_serializers",
        "check_source_in_a_job", "check_source_serializers", "sample_batch",
    ],
    "sluice.serializers": [
        "JsonSerializer", "PickleSerializer", "SimpleVersionedSerializer", "SourceSplitSerializer",
        "from_json_value", "schema_from_text", "schema_to_text", "to_json_value",
    ],
    "sluice.runtime.spark": [
        "SlotWaitTimeoutError", "SparkOptions", "SparkRuntime", "SparkStageError", "check_cluster", "spark_context",
    ],
    "sluice.cli": ["main"],
}


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_public_surface_is_pinned(package: str) -> None:
    assert sorted(importlib.import_module(package).__all__) == sorted(PUBLIC[package])


def _modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(sluice.__path__, "sluice.") if not m.name.endswith("__main__"))


def test_every_module_declares_all_and_exports_only_what_exists() -> None:
    problems = []
    for name in _modules():
        mod = importlib.import_module(name)
        exported = getattr(mod, "__all__", None)
        if exported is None:
            problems.append(f"{name} has no __all__")
            continue
        problems += [f"{name}.__all__ names {n!r}, which it does not define" for n in exported if not hasattr(mod, n)]
    assert not problems, "\n".join(problems)
