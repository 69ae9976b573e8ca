"""The job status machine: every legal and illegal transition, and the paths real jobs take through it."""

from __future__ import annotations

import itertools
import time

import pyarrow as pa
import pytest
from sluice import CheckpointConfig, FixedDelayRestart, JobFailedError, NoRestart, Pipeline
from sluice.checkpoint.storage_loader import checkpoint_storage
from sluice.connectors.generator import GeneratorSource
from sluice.errors import IllegalTransitionError, SluiceError
from sluice.runtime.job import run_job
from sluice.runtime.local import LocalRuntime
from sluice.runtime.status import TRANSITIONS, JobLifecycle, JobStatus, check_transition
from sluice.sinks.testing import TwoPhaseCommitTestSink, read_committed

S = JobStatus
TERMINAL = {S.FINISHED, S.CANCELLED, S.FAILED, S.STOPPED}


@pytest.mark.parametrize(("src", "dst"), list(itertools.product(JobStatus, JobStatus)))
def test_every_pair_is_either_allowed_by_the_table_or_refused_naming_both(src: JobStatus, dst: JobStatus) -> None:
    lc = JobLifecycle("j", src)
    if dst in TRANSITIONS[src]:
        lc.transition(dst)
        assert lc.status is dst and [s for s, _ in lc.history] == [src, dst]
    else:
        with pytest.raises(IllegalTransitionError, match=f"job 'j': cannot go from {src} to {dst} ") as e:
            lc.transition(dst)
        assert isinstance(e.value, SluiceError) and lc.status is src and len(lc.history) == 1


def test_the_table_has_one_start_and_every_status_can_end() -> None:
    assert set(TRANSITIONS) == set(JobStatus)
    assert {s for s in JobStatus if s.is_terminal} == TERMINAL
    reachable, todo = {S.CREATED}, [S.CREATED]
    while todo:
        for nxt in TRANSITIONS[todo.pop()] - reachable:
            reachable.add(nxt)
            todo.append(nxt)
    assert reachable == set(JobStatus)
    for s in set(JobStatus) - TERMINAL:
        seen, todo = {s}, [s]
        while todo:
            for nxt in TRANSITIONS[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        assert seen & TERMINAL, f"{s} can never end"
    # the decisions the table encodes
    assert S.RUNNING in TRANSITIONS[S.STOPPING], "a failed stop-with-savepoint leaves the job running"
    assert {s for s in JobStatus if S.CANCELLING in TRANSITIONS[s]} == {S.CREATED, S.RUNNING, S.RESTARTING, S.STOPPING}
    assert TRANSITIONS[S.CANCELLING] == {S.CANCELLED} and TRANSITIONS[S.FAILING] == {S.FAILED}


def test_status_is_a_string() -> None:
    assert S.FINISHED == "finished" and f"{S.CANCELLED}" == "cancelled"
    check_transition(S.RUNNING, S.FINISHED)


def test_a_cancel_wins_over_what_the_job_thread_does_next() -> None:
    lc = JobLifecycle("j")
    hooked: list[str] = []
    lc.on_cancel(lambda: hooked.append("first"))
    lc.on_cancel(lambda: hooked.append("current"))  # replaces the first
    assert lc.advance(S.RUNNING)
    assert lc.cancel() and hooked == ["current"]
    assert not lc.cancel(), "already cancelling"
    assert not lc.advance(S.RESTARTING) and not lc.advance(S.FINISHED) and lc.status is S.CANCELLING
    lc.on_cancel(lambda: hooked.append("late"))  # a hook set while cancelling runs at once
    t0 = time.monotonic()
    lc.sleep(600)  # a restart delay ends as soon as the job is cancelling
    assert time.monotonic() - t0 < 60 and hooked == ["current", "late"]
    assert lc.advance(S.CANCELLED) and not lc.cancel(), "an ended job cannot be cancelled"


def pipeline(tmp_path, name: str, fail_first: int = 0, **kw) -> Pipeline:
    """A bounded job whose map fails on its first ``fail_first`` batches (each failure ends an attempt)."""
    failures = itertools.count()

    def maybe_fail(b: pa.RecordBatch) -> pa.RecordBatch:
        if next(failures) < fail_first:
            raise ValueError("flaky")
        return b

    p = Pipeline(name, checkpoint=CheckpointConfig(interval=0.05, storage=f"{tmp_path}/chk"), **kw)
    src = GeneratorSource(num_splits=1, records_per_split=200, batch_size=20)
    p.source(src).map_batches(maybe_fail).sink(TwoPhaseCommitTestSink(f"{tmp_path}/out"))
    return p


def statuses(lc: JobLifecycle) -> list[JobStatus]:
    return [s for s, _ in lc.history]


def test_a_job_that_restarts_once_goes_created_running_restarting_running_finished(tmp_path) -> None:
    p = pipeline(tmp_path, "flaky", fail_first=1, restart=FixedDelayRestart(attempts=2, delay=0))
    lc = JobLifecycle("flaky")
    result = run_job(p.build(), p.job_config(restore="none"), LocalRuntime().run_attempt, lifecycle=lc)
    assert result.status is S.FINISHED and result.attempts == 2 and len(result.failures) == 1
    assert statuses(lc) == [S.CREATED, S.RUNNING, S.RESTARTING, S.RUNNING, S.FINISHED]
    assert read_committed(f"{tmp_path}/out").num_rows == 200


def test_a_job_out_of_restarts_goes_failing_failed(tmp_path) -> None:
    p = pipeline(tmp_path, "doomed", fail_first=10**6, restart=FixedDelayRestart(attempts=1, delay=0))
    lc = JobLifecycle("doomed")
    with pytest.raises(JobFailedError, match="failed after 2 attempt"):
        run_job(p.build(), p.job_config(restore="none"), LocalRuntime().run_attempt, lifecycle=lc)
    assert statuses(lc) == [S.CREATED, S.RUNNING, S.RESTARTING, S.RUNNING, S.FAILING, S.FAILED]


def test_a_job_cancelled_before_it_started_runs_no_attempt(tmp_path) -> None:
    p = pipeline(tmp_path, "never")
    lc = JobLifecycle("never")
    assert lc.cancel()
    result = run_job(p.build(), p.job_config(restore="none"), LocalRuntime().run_attempt, lifecycle=lc)
    assert result.status is S.CANCELLED and result.attempts == 0
    assert statuses(lc) == [S.CREATED, S.CANCELLING, S.CANCELLED]
    assert read_committed(f"{tmp_path}/out") is None


@pytest.mark.timeout(120)
def test_cancel_during_a_restart_delay_ends_the_job_without_waiting_for_the_delay(tmp_path) -> None:
    p = pipeline(tmp_path, "waiting", fail_first=10**6, restart=FixedDelayRestart(attempts=5, delay=3600))
    client = p.start(runtime="local", restore="none")
    while client.status is not S.RESTARTING:
        assert client.running, "the job ended before it restarted"
        time.sleep(0.01)
    result = client.cancel()
    assert result.status is S.CANCELLED and client.status is S.CANCELLED
    assert result.attempts == 1 and len(result.failures) == 1


def test_cancelling_a_finished_job_keeps_its_result_and_checkpoints(tmp_path) -> None:
    p = pipeline(tmp_path, "done", restart=NoRestart())
    p.checkpoint = p.checkpoint.model_copy(update={"retain_on_cancel": False})
    client = p.start(runtime="local", restore="none")
    assert client.wait().status is S.FINISHED
    result = client.cancel()
    assert result.status is S.FINISHED and client.status is S.FINISHED
    assert len(checkpoint_storage(f"{tmp_path}/chk", "done").completed()) == 1, "retained, not discarded"


@pytest.mark.timeout(120)
def test_a_cancel_that_races_the_start_of_an_attempt_ends_it(tmp_path) -> None:
    """The cancel comes after the attempt was created but before the runtime knows of it: the runtime
    itself is never told, yet the unbounded job ends."""
    p = Pipeline("endless", checkpoint=CheckpointConfig(interval=0.05, storage=f"{tmp_path}/chk"))
    p.source(GeneratorSource(num_splits=1, records_per_split=None, batch_size=10)).sink(
        TwoPhaseCommitTestSink(f"{tmp_path}/out")
    )
    lc = JobLifecycle("endless")
    result = run_job(
        p.build(), p.job_config(restore="none"), LocalRuntime().run_attempt, on_attempt=lambda a: lc.cancel(),
        lifecycle=lc,
    )
    assert result.status is S.CANCELLED and result.attempts == 1 and not result.failures


def test_a_runtime_cancelled_directly_ends_the_job_cancelled(tmp_path) -> None:
    p = pipeline(tmp_path, "direct")
    rt = LocalRuntime()
    lc = JobLifecycle("direct")
    result = run_job(p.build(), p.job_config(restore="none"), rt.run_attempt, on_attempt=lambda a: rt.cancel(),
                     lifecycle=lc)
    assert result.status is S.CANCELLED and statuses(lc)[-2:] == [S.CANCELLING, S.CANCELLED]
