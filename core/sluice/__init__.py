"""sluice: exactly-once ETL from Kafka into files and tables, with Flink-style checkpoints.

The public API is re-exported here; see ``sluice.api`` for the pipeline, ``sluice.source`` and
``sluice.sink`` for the connector SPIs.
"""

from sluice.api import JobClient, KeyedStream, Pipeline, Stream
from sluice.config import (
    CheckpointConfig,
    ExponentialBackoffRestart,
    FailureRateRestart,
    FixedDelayRestart,
    NoRestart,
    RestartStrategy,
)
from sluice.errors import (
    BadRecordError,
    CheckpointError,
    CheckpointFailureReason,
    CommitError,
    ConfigError,
    GraphError,
    JobFailedError,
    RestoreError,
    SluiceError,
    UserFunctionError,
)
from sluice.functions import KeyedContext, KeyedProcessFunction, RuntimeContext, TimerService
from sluice.runtime.job import JobResult
from sluice.runtime.status import JobStatus
from sluice.state.api import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor

__version__ = "0.1.0"

__all__ = [
    "BadRecordError",
    "CheckpointConfig",
    "CheckpointError",
    "CheckpointFailureReason",
    "CommitError",
    "ConfigError",
    "ExponentialBackoffRestart",
    "FailureRateRestart",
    "FixedDelayRestart",
    "GraphError",
    "JobClient",
    "JobFailedError",
    "JobResult",
    "JobStatus",
    "KeyedContext",
    "KeyedProcessFunction",
    "KeyedStream",
    "ListStateDescriptor",
    "MapStateDescriptor",
    "NoRestart",
    "Pipeline",
    "RestartStrategy",
    "RestoreError",
    "RuntimeContext",
    "SluiceError",
    "Stream",
    "TimerService",
    "UserFunctionError",
    "ValueStateDescriptor",
    "__version__",
]
