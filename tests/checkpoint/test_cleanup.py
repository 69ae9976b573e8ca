"""Cleaning up never masks the cause (issue 21, point 1).

A failure while discarding, aborting or closing is logged and attached to the attempt's failure, never
raised in its place: the restart strategy sees the original failure, and the error a user sees names it.
Storage operations are retried for ``storage_retry_timeout``; a longer outage costs restarts, never the
job while restarts remain (on S3 too, behind a TCP proxy that cuts moto off).
"""

from __future__ import annotations

import errno
import time
from typing import Any

import pytest
from sluice import CheckpointConfig, FixedDelayRestart, NoRestart, Pipeline
from sluice.checkpoint.coordinator import CheckpointCoordinator, CoordinatedTasks, CoordinatorServices
from sluice.checkpoint.storage_loader import checkpoint_storage
from sluice.connectors.generator import GeneratorSource
from sluice.errors import ConfigError, JobFailedError
from sluice.graph import SubtaskId
from sluice.runtime.status import JobStatus
from sluice.sink import SinkContext, SinkWriter
from sluice.sinks.testing import TwoPhaseCommitTestSink, read_committed

from tests.checkpoint.proxy import proxy_to
from tests.checkpoint.storages import FlakyStorage, use_storage
from tests.sinks.conftest import MotoS3

A = SubtaskId(0, 0)


class _Handle:
    def trigger_checkpoint(self, barrier: Any) -> None: ...
    def notify_checkpoint_complete(self, checkpoint_id: int) -> None: ...
    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None: ...


def test_coordinator_stop_reports_a_failed_discard_instead_of_raising(tmp_path) -> None:
    storage = FlakyStorage(str(tmp_path), "job")
    storage.retry_timeout = 0
    reported: list[tuple[str, BaseException]] = []
    c = CheckpointCoordinator(
        CheckpointConfig(interval=None, storage=str(tmp_path)),
        CoordinatedTasks({A: _Handle()}, {A}),
        CoordinatorServices(
            storage, {"job_id": "job"}, on_cleanup_failure=lambda what, exc: reported.append((what, exc))
        ),
    )
    cid = c._try_trigger(forced=True)
    storage.down.add("delete")
    c.stop()  # aborts the pending checkpoint: its discard fails
    assert [what for what, _ in reported][:1] == [f"discarding checkpoint {cid}"], reported
    assert all(isinstance(exc, OSError) and exc.errno == errno.EIO for _, exc in reported)
    assert c.history[-1].status == "failed" and storage.fired


class _FailsInCheckpoint(TwoPhaseCommitTestSink):
    """Its first attempt fails while pre-committing its first checkpoint (so that checkpoint is pending) and
    the checkpoint storage cannot delete anything from then until the next attempt writes.

    The first checkpoint, whatever its id: on a starved machine the generator's 3,000 rows can end before a
    second checkpoint is triggered, and a job whose only checkpoint is the final one never failed here."""

    def __init__(self, directory: str, storage: FlakyStorage) -> None:
        super().__init__(directory)
        self.storage = storage

    def create_writer(self, ctx: SinkContext, restored: list[Any]) -> SinkWriter[str]:
        writer = super().create_writer(ctx, restored)
        if ctx.attempt > 0:
            self.storage.down.discard("delete")
            return writer

        def failing(checkpoint_id: int) -> list[str]:
            self.storage.down.add("delete")
            raise RuntimeError("boom: the root cause")

        writer.prepare_commit = failing  # type: ignore[method-assign]
        return writer


def _job(tmp_path: Any, storage: FlakyStorage, restart: Any) -> tuple[Pipeline, GeneratorSource]:
    src = GeneratorSource(num_splits=1, records_per_split=3000, batch_size=50, rows_per_second=6000)
    p = Pipeline(
        "cleanup",
        checkpoint=CheckpointConfig(interval=0.05, storage=str(tmp_path / "chk"), storage_retry_timeout=0),
        restart=restart,
    )
    p.source(src).sink(_FailsInCheckpoint(str(tmp_path / "out"), storage))
    return p, src


def test_a_failing_discard_is_attached_and_the_restart_follows(tmp_path, monkeypatch) -> None:
    storage = FlakyStorage(str(tmp_path / "chk"), "cleanup")
    use_storage(monkeypatch, storage)
    p, _ = _job(tmp_path, storage, FixedDelayRestart(attempts=2, delay=0))
    result = p.run(runtime="local", restore="none", control_endpoint=None)
    assert any(f.startswith("delete") for f in storage.fired), "the outage did not hit the cleanup"
    assert result.status == "finished" and result.attempts == 2, result.failures
    (failure,) = result.failures
    assert "boom: the root cause" in failure.split("; also failed:")[0], failure
    assert "also failed:" in failure and "injected storage outage" in failure, failure
    ids = sorted(read_committed(str(tmp_path / "out")).column("id").to_pylist())  # type: ignore[union-attr]
    assert ids == list(range(3000)), f"{len(ids)} rows committed, {len(set(ids))} distinct"


def test_the_error_a_user_sees_names_the_root_cause(tmp_path, monkeypatch) -> None:
    storage = FlakyStorage(str(tmp_path / "chk"), "cleanup")
    use_storage(monkeypatch, storage)
    p, _ = _job(tmp_path, storage, NoRestart())
    with pytest.raises(JobFailedError) as ei:
        p.run(runtime="local", restore="none", control_endpoint=None)
    assert any(f.startswith("delete") for f in storage.fired), "the outage did not hit the cleanup"
    assert "boom: the root cause" in str(ei.value) and "injected storage outage" in str(ei.value)
    assert "boom: the root cause" in str(ei.value.__cause__), repr(ei.value.__cause__)


def test_storage_operations_are_retried_while_transient(tmp_path) -> None:
    storage = FlakyStorage(str(tmp_path), "job")
    storage.retry_timeout = 600.0  # bounded by the outage below, which ends after three failures
    storage.down.add("write")
    real = storage._outage

    def three_failures(kind: str, path: str) -> None:
        if len(storage.fired) >= 3:
            storage.down.clear()
        real(kind, path)

    storage._outage = three_failures  # type: ignore[method-assign]
    path = storage.write_task_state(1, "0-0.state", b"state")
    assert len(storage.fired) == 3 and storage.read_file(path) == b"state"
    # errors a retry cannot cure are raised at once (not retried for 600 s)
    (tmp_path / "a-file").write_text("not a folder")
    unwritable = checkpoint_storage(str(tmp_path / "a-file"), "job")
    unwritable.retry_timeout = 600.0
    with pytest.raises(NotADirectoryError):
        unwritable.write_task_state(1, "0-0.state", b"state")


def test_an_outage_longer_than_the_retry_time_gives_up(tmp_path) -> None:
    storage = FlakyStorage(str(tmp_path), "job")
    storage.retry_timeout = 0.3
    storage.down.add("write")
    with pytest.raises(OSError, match="injected storage outage"):
        storage.write_metadata(1, {"checkpoint_id": 1, "tasks": {}})
    assert len(storage.fired) >= 2, "retried before giving up"
    assert not list(tmp_path.glob("job/chk-1/*.tmp"))


@pytest.mark.parametrize("bad", [-1, float("inf"), float("nan")])
def test_storage_retry_timeout_is_validated(bad: float) -> None:
    with pytest.raises(ConfigError, match=r"storage_retry_timeout\)?:? must be a finite duration"):
        CheckpointConfig(storage_retry_timeout=bad)


def test_s3_checkpoint_clients_try_once_per_request_with_bounded_timeouts(moto_s3: MotoS3) -> None:
    st = checkpoint_storage(f"s3://{moto_s3.new_bucket()}/chk", "job", **moto_s3.options())
    config = st._client.meta.config  # type: ignore[attr-defined]
    assert config.retries["total_max_attempts"] == 1
    assert (config.connect_timeout, config.read_timeout) == (5.0, 20.0)
    tuned = checkpoint_storage(f"s3://{moto_s3.new_bucket()}/chk", "job", read_timeout=60, **moto_s3.options())
    assert tuned._client.meta.config.read_timeout == 60.0  # type: ignore[attr-defined]


@pytest.mark.s3
def test_an_s3_outage_longer_than_the_retry_time_costs_restarts_not_the_job(moto_s3: MotoS3, tmp_path) -> None:
    """moto behind a TCP proxy, cut while checkpoints run until that cost a restart: the job restarts (as
    often as it takes while the outage lasts), then finishes, and its committed output equals its input."""
    bucket = moto_s3.new_bucket()
    with proxy_to("127.0.0.1", moto_s3.port) as proxy:
        src = GeneratorSource(num_splits=2, records_per_split=4000, batch_size=50, rows_per_second=1500)
        p = Pipeline(
            "s3-outage",
            parallelism=2,
            restart=FixedDelayRestart(attempts=30, delay=0.2),
            checkpoint=CheckpointConfig(
                interval=0.1,
                storage=f"s3://{bucket}/chk",
                storage_options={**moto_s3.options(), "endpoint_url": proxy.endpoint},
                storage_retry_timeout=0.5,
            ),
        )
        p.source(src).sink(TwoPhaseCommitTestSink(str(tmp_path / "out")))
        client = p.start(runtime="local", restore="none", control_endpoint=None)
        deadline = time.monotonic() + 120
        while sum(c.status == "completed" for c in client.checkpoint_history) < 2:
            assert client.running and time.monotonic() < deadline, "no checkpoint completed"
            time.sleep(0.02)
        proxy.cut()
        # the outage lasts until it cost a restart (a checkpoint could not be written within the retry
        # time), however long that takes on a loaded machine
        while client.status is not JobStatus.RESTARTING and client.monitor.attempts < 2:
            assert client.running and time.monotonic() < deadline, "the outage cost no restart"
            time.sleep(0.01)
        assert proxy.refused > 0
        proxy.restore()
        result = client.wait(300)
    assert result.status == "finished" and result.attempts >= 2, result.failures
    assert "StorageError" in result.failures[0], result.failures
    ids = sorted(read_committed(str(tmp_path / "out")).column("id").to_pylist())  # type: ignore[union-attr]
    assert ids == sorted(src.expected().column("id").to_pylist()), f"{len(ids)} rows, {len(set(ids))} distinct"
