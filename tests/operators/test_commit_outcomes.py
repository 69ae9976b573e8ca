"""Committers report what a commit did (``CommitOutcome``); the engine retries ``RETRY_LATER`` like an error.

A committer that refuses a few times (a table's commit conflict, a throttled store) delays its commit but
loses and duplicates nothing; one that refuses for good fails the job with a CommitError naming the sink,
and the restored checkpoint is committed again by the next attempt.
"""

from __future__ import annotations

from typing import Any

import pytest
from sluice import CheckpointConfig, CommitError, FixedDelayRestart, JobFailedError, NoRestart, Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.operators.committables import commit_with_retry
from sluice.sink import CommitOutcome, Committer, GlobalCommitter, GlobalCommitterContext, SinkContext
from sluice.sinks.testing import TwoPhaseCommitTestSink, read_committed


def test_commit_with_retry_reports_outcomes_and_counts_retries() -> None:
    answers = [CommitOutcome.RETRY_LATER, CommitOutcome.RETRY_LATER, CommitOutcome.COMMITTED]
    counted: dict[str, int] = {}

    def metric(name: str, n: int) -> None:
        counted[name] = counted.get(name, 0) + n

    assert commit_with_retry("s", lambda: answers.pop(0), metric=metric) is CommitOutcome.COMMITTED
    assert counted.pop("commit_time_us") >= 0  # the call's time, retries included
    assert counted == {"commit_retries": 2, "commits": 1}
    assert commit_with_retry("s", lambda: CommitOutcome.ALREADY_COMMITTED, metric=metric) is (
        CommitOutcome.ALREADY_COMMITTED
    )
    assert counted["commits_already_committed"] == 1
    assert commit_with_retry("s", lambda: None) is CommitOutcome.COMMITTED  # a committer from before outcomes


def test_retry_later_forever_is_a_commit_error_naming_the_sink() -> None:
    with pytest.raises(CommitError, match=r"sink 'tables'.*3 attempts.*retry later"):
        commit_with_retry("tables", lambda: CommitOutcome.RETRY_LATER, attempts=3)


class _Refusing(TwoPhaseCommitTestSink):
    """Answers RETRY_LATER to the first ``refusals`` commits of each committer, publishing nothing."""

    def __init__(self, directory: str, global_commit: bool, refusals: int) -> None:
        super().__init__(directory, global_commit=global_commit)
        self.refusals = refusals

    def _refuse(self, committer: Any) -> Any:
        commit, left = committer.commit, [self.refusals]

        def refusing(*args: Any) -> CommitOutcome:
            if left[0] > 0:
                left[0] -= 1
                return CommitOutcome.RETRY_LATER
            return commit(*args)  # type: ignore[no-any-return]

        committer.commit = refusing
        return committer

    def create_committer(self, ctx: SinkContext) -> Committer[str] | None:
        c = super().create_committer(ctx)
        return None if c is None else self._refuse(c)

    def create_global_committer(self, ctx: GlobalCommitterContext) -> GlobalCommitter[str] | None:
        return self._refuse(super().create_global_committer(ctx))  # type: ignore[no-any-return]


def _job(tmp_path: Any, sink: TwoPhaseCommitTestSink, attempts: int) -> Pipeline:
    p = Pipeline(
        "refusing-committer",
        checkpoint=CheckpointConfig(interval=0.05, storage=str(tmp_path / "chk")),
        restart=FixedDelayRestart(attempts=attempts, delay=0.0) if attempts else NoRestart(),
    )
    p.source(GeneratorSource(num_splits=2, records_per_split=300, batch_size=50)).sink(sink)
    return p


@pytest.mark.parametrize("global_commit", [False, True], ids=["per-subtask", "global"])
def test_a_committer_that_asks_to_retry_later_commits_everything_once(tmp_path: Any, global_commit: bool) -> None:
    sink = _Refusing(str(tmp_path / "out"), global_commit, refusals=2)
    result = _job(tmp_path, sink, attempts=0).run(runtime="local", restore="none")
    assert result.status == "finished" and result.attempts == 1
    assert result.metrics["commit_retries"] >= 2, result.metrics
    assert result.metrics["commits"] >= 1, result.metrics
    table = read_committed(str(tmp_path / "out"))
    assert table is not None and sorted(table.column("id").to_pylist()) == list(range(600))


def test_a_committer_that_never_commits_fails_the_job_and_the_restore_commits(tmp_path: Any) -> None:
    sink = _Refusing(str(tmp_path / "out"), global_commit=True, refusals=10**6)
    with pytest.raises(JobFailedError) as err:
        _job(tmp_path, sink, attempts=0).run(runtime="local", restore="none")
    assert "retry later" in str(err.value.__cause__ or err.value) or "commit" in str(err.value)
    assert read_committed(str(tmp_path / "out")) is None, "nothing may be visible"
    # the committer recovers: the next run restores the latest checkpoint, commits it again and goes on
    sink.refusals = 0
    result = _job(tmp_path, sink, attempts=0).run(runtime="local", restore="latest")
    assert result.status == "finished"
    table = read_committed(str(tmp_path / "out"))
    assert table is not None
    ids = sorted(table.column("id").to_pylist())
    assert ids == list(range(600)), f"{len(ids)} rows"
