"""Root cause first (issue 10, hole 4): the first failure of an attempt is its root cause.

When a subtask raises in a slot, that slot reports the error and stops; its peers lose their links to it,
Spark kills the barrier stage's other tasks and fails the stage. Each of these reaches the driver as a
failure of its own (SlotLostError, SparkStageError, a peer's lost link), on other connections and threads
than the failing slot's report, so on a loaded machine any of them may be seen first. These tests force
that order: the driver holds the failing slot's report back until another failure reached the attempt,
and the user's exception must still be the root cause, with the others attached.
"""

from __future__ import annotations

import re
import tempfile
import threading
import time
from typing import Any

import pyarrow as pa
import pytest
from sluice import CheckpointConfig, FixedDelayRestart, Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.errors import JobFailedError
from sluice.runtime.attempt import JobAttempt
from sluice.sinks.testing import TwoPhaseCommitTestSink
from sluice.testing.faults import FaultInjector

from tests.runtime.spark.runner import reference, run_shape_on, shape_named

pytestmark = pytest.mark.spark


class _HeldReports:
    """Holds the first task failure report at the driver until another failure reached the attempt."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, timeout: float = 120.0) -> None:
        self.held: list[BaseException] = []
        #: whether another failure was recorded while the report was held (the order the test forces)
        self.overtaken: list[bool] = []
        self._lock = threading.Lock()
        original = JobAttempt.failed

        def failed(attempt: JobAttempt, task: Any, error: BaseException, *args: Any, **kwargs: Any) -> None:
            with self._lock:
                hold = task is not None and not self.held
                if hold:
                    self.held.append(error)
            if hold:
                deadline = time.monotonic() + timeout
                while attempt.failure is None and time.monotonic() < deadline:
                    time.sleep(0.01)
                self.overtaken.append(attempt.failure is not None)
            original(attempt, task, error, *args, **kwargs)

        monkeypatch.setattr(JobAttempt, "failed", failed)


def test_injected_fault_stays_the_root_cause_when_the_loss_is_seen_first(
    spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = _HeldReports(monkeypatch)
    expected = reference("rebalance", 7)
    faults = FaultInjector(point="process", after=2)
    got, result = run_shape_on("spark", shape_named("rebalance"), 7, faults)
    assert held.overtaken == [True], "the slot's report was not overtaken by another failure"
    assert len(faults.fired) == 1 and result.attempts == 2, result.failures
    first = result.failures[0]
    assert first.startswith("attempt 0: InjectedFault: injected fault at process"), first
    # the failures seen first are attached to the root cause, not substituted for it
    assert "; also failed: " in first, first
    assert got == list(expected)


def _fails_in_slot_1(batch: pa.RecordBatch) -> pa.RecordBatch:
    if 1 in batch.column("split").to_pylist():
        raise ValueError("bad row in split 1")
    return batch


def test_user_error_is_the_root_cause_of_the_failed_job(spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    held = _HeldReports(monkeypatch)
    d = tempfile.mkdtemp()
    p = Pipeline(
        "root-cause",
        checkpoint=CheckpointConfig(interval=0.1, storage=f"{d}/chk"),
        restart=FixedDelayRestart(attempts=0, delay=0.0),
    )
    src = GeneratorSource(num_splits=2, records_per_split=200, batch_size=10)
    s = p.source(src, parallelism=2).map_batches(_fails_in_slot_1, name="picky", parallelism=2)
    s.rebalance(parallelism=2).sink(TwoPhaseCommitTestSink(f"{d}/out"), parallelism=2)
    with pytest.raises(JobFailedError) as info:
        p.run(runtime="spark", restore="none")
    assert held.overtaken == [True], "the slot's report was not overtaken by another failure"
    root, _, others = str(info.value).partition("root cause: ")[2].partition("; also failed: ")
    # the user's file and line, found on the executor, travel with the error to the driver
    line = _fails_in_slot_1.__code__.co_filename
    assert f"UserFunctionError: operator 'picky' failed at {line}:" in root, root
    assert re.search(r"\(in _fails_in_slot_1\): ValueError: bad row in split 1", root), root
    assert others, "the failures the user's error caused are not attached"
    cause = info.value.__cause__
    assert type(cause).__name__ not in ("SlotLostError", "SparkStageError", "NoneType"), root
    # the slot's traceback travels with the error
    assert any("_fails_in_slot_1" in note for note in getattr(cause, "__notes__", [])), cause
