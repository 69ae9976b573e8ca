"""An error a restart cannot cure, raised in a Spark slot, fails the job at once on the driver.

The slot's exception crosses to the driver pickled; it must keep its type and ``recoverable`` flag (a
``SluiceError`` whose constructor takes other arguments than its message once lost both and was retried).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from sluice import CheckpointConfig, FixedDelayRestart, Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.errors import BadRecordError, JobFailedError, UserFunctionError
from sluice.runtime.status import JobStatus
from sluice.sinks.testing import TwoPhaseCommitTestSink

pytestmark = pytest.mark.spark


def _bad_record(batch: pa.RecordBatch) -> pa.RecordBatch:
    if batch.num_rows and batch.column("id")[0].as_py() >= 40:
        raise BadRecordError("cannot decode", topic="orders", partition=3, offset=41)
    return batch


def test_a_bad_record_in_a_slot_fails_the_job_without_restarts(spark: Any, tmp_path: Any) -> None:
    p = Pipeline(
        "unrecoverable-on-spark",
        parallelism=2,
        checkpoint=CheckpointConfig(interval=0.2, storage=str(tmp_path / "chk")),
        restart=FixedDelayRestart(attempts=3, delay=0.0),
    )
    p.source(GeneratorSource(num_splits=2, records_per_split=100, batch_size=10)).map_batches(_bad_record).sink(
        TwoPhaseCommitTestSink(str(tmp_path / "out"))
    )
    client = p.start(runtime="spark", restore="none")
    with pytest.raises(JobFailedError, match="failed at once") as err:
        client.wait()
    assert isinstance(err.value.__cause__, UserFunctionError), repr(err.value.__cause__)
    cause = err.value.__cause__.__cause__
    assert isinstance(cause, BadRecordError), repr(cause)  # its type survived the trip from the slot
    assert (cause.topic, cause.partition, cause.offset) == ("orders", 3, 41)
    statuses = [s for s, _ in client._lifecycle.history]
    assert JobStatus.RESTARTING not in statuses, f"a restart was spent on it: {statuses}"
    assert statuses[-1] is JobStatus.FAILED
