"""Unaligned and timeout-adaptive checkpoints: completion under backpressure, channel state, restore."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from click.testing import CliRunner
from sluice import CheckpointConfig, FixedDelayRestart, Pipeline, RestoreError
from sluice.checkpoint.storage import LocalCheckpointStorage
from sluice.cli import main as cli
from sluice.connectors.generator import GeneratorSource
from sluice.sinks.testing import TwoPhaseCommitTestSink, read_committed

from tests.faults.shapes import RunningCount, rows_of, with_key
from tests.runtimes import spark_in_soak


def slow(delay: float) -> Any:
    def op(b: pa.RecordBatch) -> pa.RecordBatch:
        time.sleep(delay)
        return b

    return op


def backpressured(tmp: str, name: str, buffers: int = 8, **ck: Any) -> Pipeline:
    p = Pipeline(name, parallelism=2, buffers_per_channel=buffers,
                 checkpoint=CheckpointConfig(interval=0.1, storage=f"{tmp}/chk", tolerable_failed_checkpoints=1000,
                                             num_retained=1000, **ck))
    src = GeneratorSource(num_splits=2, records_per_split=None, batch_size=50)
    p.source(src).rebalance().map_batches(slow(0.01), name="slow").sink(TwoPhaseCommitTestSink(f"{tmp}/out"))
    return p


def run_until(
    p: Pipeline, what: str, condition: Callable[[Any], bool], runtime: str = "local", **start: Any
) -> list[Any]:
    """Run ``p`` until a checkpoint of its history satisfies ``condition``, then cancel it; its history.

    Ends on the condition, not after some seconds: on a loaded machine the job may need much longer to get
    there (the deadline only turns a job that never gets there into a failure instead of a hang).
    """
    client = p.start(runtime=runtime, **{"restore": "none", **start})
    deadline = time.monotonic() + 180
    while not any(condition(c) for c in client.checkpoint_history):
        assert client.running, f"the job ended before {what}"
        assert time.monotonic() < deadline, f"no checkpoint {what} within 180 s"
        time.sleep(0.02)
    return client.cancel().checkpoints


def completed_with_inflight(c: Any) -> bool:
    return bool(c.status == "completed" and c.inflight_bytes > 0)


@spark_in_soak
def test_unaligned_completes_under_backpressure_where_aligned_expires(tmp_path, runtime: str) -> None:
    run_until(
        backpressured(str(tmp_path / "a"), "aligned", timeout=0.15),
        "expired (the backlog ahead of aligned barriers is too long)",
        lambda c: c.failure_reason == "EXPIRED",
        runtime,
    )
    unaligned = run_until(
        backpressured(str(tmp_path / "u"), "unaligned", timeout=0.15, unaligned=True),
        "persisted overtaken in-flight data as channel state",
        completed_with_inflight,
        runtime,
    )
    done = [c for c in unaligned if c.status == "completed"]
    assert done and all(c.alignment == "unaligned" for c in done)


def test_adaptive_stays_aligned_without_backpressure_and_switches_under_it(tmp_path) -> None:
    # 5 s to align: a job without backpressure aligns far sooner, however loaded the machine
    quiet = Pipeline("quiet", parallelism=2, checkpoint=CheckpointConfig(
        interval=0.05, storage=f"{tmp_path}/q/chk", aligned_checkpoint_timeout=5.0))
    quiet.source(GeneratorSource(num_splits=2, records_per_split=3000, batch_size=20, rows_per_second=3000)).rebalance(
    ).sink(TwoPhaseCommitTestSink(f"{tmp_path}/q/out"))
    result = quiet.run(runtime="local", restore="none")
    done = [c for c in result.checkpoints if c.status == "completed"]
    assert done and all(c.inflight_bytes == 0 and not c.switched_to_unaligned for c in done)
    run_until(
        backpressured(str(tmp_path / "l"), "loaded", aligned_checkpoint_timeout=0.02),
        "switched to unaligned and persisted in-flight data",
        lambda c: completed_with_inflight(c) and c.switched_to_unaligned,
    )


def keyed_backpressured(tmp: str, parallelism: int, bounded: bool, **ck: Any) -> Pipeline:
    p = Pipeline("keyed-bp", buffers_per_channel=6, restart=FixedDelayRestart(attempts=3, delay=0),
                 checkpoint=CheckpointConfig(interval=0.05, storage=f"{tmp}/chk", num_retained=1000,
                                             tolerable_failed_checkpoints=1000, **ck))
    src = GeneratorSource(num_splits=3, records_per_split=900, batch_size=15,
                          rows_per_second=None if bounded else 3000)
    s = p.source(src, parallelism=3).map_batches(with_key).map_batches(slow(0.002), name="slowish")
    s.key_by("k").process(RunningCount(), parallelism=parallelism).sink(TwoPhaseCommitTestSink(f"{tmp}/out"))
    return p


def checkpoint_with_channel_state(tmp: str, job: str) -> str:
    st = LocalCheckpointStorage(f"{tmp}/chk", job)
    stats = {s["checkpoint_id"]: s for s in st.read_stats() if s["status"] == "completed"}
    with_state = [p for cid, p, _ in st.completed() if stats.get(cid, {}).get("inflight_bytes", 0) > 0]
    assert with_state, "no completed checkpoint persisted in-flight data"
    return with_state[-1]


@pytest.mark.faults
@pytest.mark.parametrize("new_parallelism", [2, 3])
def test_restore_redistributes_keyed_channel_state_by_key_group(tmp_path, new_parallelism: int) -> None:
    ref = str(tmp_path / "ref")
    reference = rows_of((keyed_backpressured(ref, 2, True).run(runtime="local", restore="none"),
                         read_committed(f"{ref}/out"))[1])
    tmp = str(tmp_path / "run")
    run_until(keyed_backpressured(tmp, 2, False, unaligned=True), "with channel state", completed_with_inflight)
    path = checkpoint_with_channel_state(tmp, "keyed-bp")
    cid = int(path.rsplit("-", 1)[1])
    # make that checkpoint the latest, as if the job had crashed right after it: drop what later checkpoints
    # committed (test-sink names carry the checkpoint id)
    for name in os.listdir(f"{tmp}/out/committed"):
        if int(name.split("-")[-3]) > cid:
            os.remove(f"{tmp}/out/committed/{name}")
    result = keyed_backpressured(tmp, new_parallelism, True, unaligned=True).run(runtime="local", restore=path)
    assert result.status == "finished"
    assert rows_of(read_committed(f"{tmp}/out")) == reference


def forward_channel_state_job(tmp: str, union_parallelism: int) -> Pipeline:
    p = Pipeline("fwd", buffers_per_channel=8, checkpoint=CheckpointConfig(
        interval=0.05, storage=f"{tmp}/chk", unaligned=True, num_retained=1000, tolerable_failed_checkpoints=1000))
    a = p.source(GeneratorSource(num_splits=1, records_per_split=None, batch_size=20, name="a"), parallelism=1)
    b = p.source(GeneratorSource(num_splits=2, records_per_split=None, batch_size=20, name="b"), parallelism=2)
    # a -> union is a rebalance exchange (priority barriers); b -> union is forward (never unaligned), so the
    # union records b's in-flight data as channel state of a forward exchange
    a.union(b, parallelism=union_parallelism).map_batches(slow(0.005), name="slow").sink(
        TwoPhaseCommitTestSink(f"{tmp}/out"), name="sink")
    return p


def test_channel_state_of_a_forward_exchange_refuses_rescale_unless_dropped(tmp_path) -> None:
    tmp = str(tmp_path)
    run_until(forward_channel_state_job(tmp, 2), "with channel state", completed_with_inflight)
    path = checkpoint_with_channel_state(tmp, "fwd")
    cid = int(path.rsplit("-", 1)[1])
    with pytest.raises(RestoreError, match=rf"forward exchange.*recover_without_channel_state={cid}"):
        forward_channel_state_job(tmp, 3).start(runtime="local", restore=path).wait()
    resumed = run_until(
        forward_channel_state_job(tmp, 3),
        "completed after the rescaled restore",
        lambda c: c.status == "completed",
        restore=path,
        recover_without_channel_state=cid,
    )
    assert any(c.status == "completed" for c in resumed)


def test_savepoints_stay_aligned_in_unaligned_mode(tmp_path, runtime: str) -> None:
    p = backpressured(str(tmp_path), "sp", unaligned=True, timeout=30)
    client = p.start(runtime=runtime, restore="none")
    deadline = time.monotonic() + 120  # until the job runs (a Spark attempt takes seconds to start)
    while not any(c.status == "completed" for c in client.checkpoint_history):
        assert client.running and time.monotonic() < deadline, "the job completed no checkpoint"
        time.sleep(0.02)
    path = client.trigger_savepoint(timeout=60)
    history = client.checkpoint_history
    client.cancel()
    sp = next(c for c in history if c.kind == "savepoint" and c.status == "completed")
    assert sp.alignment == "aligned" and sp.inflight_bytes == 0 and os.path.exists(f"{path}/_metadata")


def test_large_batches_are_split_so_a_barrier_waits_for_one_bounded_slice(tmp_path) -> None:
    seen: list[int] = []

    def record(b: pa.RecordBatch) -> pa.RecordBatch:
        seen.append(b.num_rows)
        return b

    p = Pipeline("split", max_batch_rows=100, checkpoint=CheckpointConfig(interval=0.05, storage=f"{tmp_path}/chk"))
    p.source(GeneratorSource(num_splits=1, records_per_split=5000, batch_size=2500)).map_batches(record).sink(
        TwoPhaseCommitTestSink(f"{tmp_path}/out"))
    p.run(runtime="local", restore="none")
    assert max(seen) == 100 and sum(seen) == 5000
    assert read_committed(f"{tmp_path}/out").num_rows == 5000


def test_cli_shows_unaligned_stats(tmp_path) -> None:
    run_until(backpressured(str(tmp_path), "show", unaligned=True), "with channel state", completed_with_inflight)
    st = LocalCheckpointStorage(f"{tmp_path}/chk", "show")
    cid = next(s["checkpoint_id"] for s in st.read_stats() if s["status"] == "completed" and s["inflight_bytes"])
    listing = CliRunner().invoke(cli, ["checkpoints", "list", f"{tmp_path}/chk"])
    assert listing.exit_code == 0 and "unaligned" in listing.output and "completed" in listing.output
    shown = CliRunner().invoke(cli, ["checkpoints", "show", f"{tmp_path}/chk/show/chk-{cid}"])
    assert shown.exit_code == 0, shown.output
    assert "alignment: unaligned" in shown.output and "persisted in-flight data" in shown.output
    assert "sync" in shown.output and "async" in shown.output
