"""State never silently disappears on restore: operators are identified by a stable uid (default: the name).

A checkpoint holding state of an operator uid the job no longer has (renamed or removed) fails the restore,
naming the uids, unless ``allow_non_restored_state=True``; giving the renamed operator its old uid restores
its state.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sluice import CheckpointConfig, NoRestart, Pipeline, RestoreError
from sluice.connectors.generator import GeneratorSource
from sluice.sinks.testing import TwoPhaseCommitTestSink, read_committed
from sluice.testing.faults import FaultInjector

from tests.faults.expected import expected_rows
from tests.faults.shapes import Input, RunningCount, rows_of, with_key


def build(tmp: Path, process_name: str, uid: str | None = None, map_name: str = "with-key") -> Pipeline:
    p = Pipeline(
        "compat",
        parallelism=2,
        checkpoint=CheckpointConfig(interval=0.05, storage=str(tmp / "chk")),
        restart=NoRestart(),
    )
    src = GeneratorSource(num_splits=2, records_per_split=600, batch_size=20, rows_per_second=1500)
    s = p.source(src).map_batches(with_key, name=map_name)
    counted = s.key_by("k").process(RunningCount(), name=process_name)
    if uid is not None:
        counted = counted.uid(uid)
    counted.sink(TwoPhaseCommitTestSink(str(tmp / "out")))
    return p


def crash_midway(tmp: Path) -> None:
    """Run until a checkpoint holds keyed state, then crash without restart."""
    faults = FaultInjector(point="complete_to_commit", after=3)
    with pytest.raises(Exception, match="injected fault"):
        build(tmp, "counter").run(runtime="local", faults=faults, restore="none")
    assert faults.fired


def reference(tmp: Path) -> list[tuple]:  # type: ignore[type-arg]
    """The job's output computed from its input in plain Python (the ``keyed`` shape of tests/faults/expected.py
    is this job: with_key -> key_by -> RunningCount), not from another sluice run."""
    return list(expected_rows("keyed", [Input("generator", splits=2, per_split=600, offset=0)]))


def test_renamed_stateful_operator_fails_the_restore_naming_the_uid(tmp_path: Path) -> None:
    crash_midway(tmp_path)
    with pytest.raises(RestoreError, match=r"\['counter'\].*allow_non_restored_state"):
        build(tmp_path, "counter-v2").run(runtime="local", restore="latest")


def test_allow_non_restored_state_drops_that_state(tmp_path: Path) -> None:
    crash_midway(tmp_path)
    result = build(tmp_path, "counter-v2").run(runtime="local", restore="latest", allow_non_restored_state=True)
    assert result.status == "finished"
    # the counts restarted from zero: the output is not the failure-free one
    assert rows_of(read_committed(str(tmp_path / "out"))) != reference(tmp_path / "ref")


def test_renamed_operator_with_its_old_uid_keeps_its_state(tmp_path: Path) -> None:
    crash_midway(tmp_path)
    build(tmp_path, "counter-v2", uid="counter").run(runtime="local", restore="latest")
    assert rows_of(read_committed(str(tmp_path / "out"))) == reference(tmp_path / "ref")


def test_renamed_stateless_operator_restores(tmp_path: Path) -> None:
    crash_midway(tmp_path)
    build(tmp_path, "counter", map_name="add-key").run(runtime="local", restore="latest")
    assert rows_of(read_committed(str(tmp_path / "out"))) == reference(tmp_path / "ref")


def test_uids_must_be_unique(tmp_path: Path) -> None:
    from sluice import GraphError

    p = Pipeline("dup", checkpoint=CheckpointConfig(storage=str(tmp_path)))
    s = p.source(GeneratorSource(num_splits=1, records_per_split=10)).map_batches(with_key, name="a")
    with pytest.raises(GraphError, match="uid 'a' is already used"):
        s.map_batches(with_key, name="b").uid("a")


def test_run_help_names_the_flag() -> None:
    from click.testing import CliRunner
    from sluice.cli import main

    out = CliRunner().invoke(main, ["run", "--help"]).output
    assert "--allow-non-restored-state" in out and "uid" in out
