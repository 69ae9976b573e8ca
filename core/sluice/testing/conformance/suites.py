"""pytest base classes: subclass one in a connector's tests, give it a fixture, and every check runs.

::

    from sluice.testing.conformance import SinkCase, SinkConformance, SinkTarget, SourceCase, SourceConformance

    class TestMySource(SourceConformance):
        @pytest.fixture(scope="class")
        def source_case(self) -> SourceCase:
            return SourceCase(MySource(...), expected=..., columns=["id"])

    class TestMySink(SinkConformance):
        @pytest.fixture
        def sink_case(self, tmp_path) -> SinkCase:
            def target() -> SinkTarget: ...
            return SinkCase(target)

Each test method is one contract, so a broken connector fails exactly the tests of the contracts it
breaks, each with a message naming the contract. This module does not import pytest: the classes are
plain classes whose ``test_*`` methods pytest collects.
"""

from __future__ import annotations

from collections.abc import Callable

from sluice.testing.conformance.jobs import check_sink_in_a_job, check_source_in_a_job
from sluice.testing.conformance.serializers import check_sink_serializers, check_source_serializers
from sluice.testing.conformance.sinks import (
    RECOVERY_STEPS,
    SinkCase,
    check_abort_uncommitted,
    check_commit_idempotent,
    check_nothing_visible_before_commit,
    check_one_global_commit_per_checkpoint,
    check_recover_after_crash,
)
from sluice.testing.conformance.sources import (
    SourceCase,
    check_bounded_end_of_input,
    check_enumerator_restore,
    check_every_split_read_once,
    check_failed_reader_reassignment,
    check_no_record_after_stop,
    check_reader_restore,
    check_rescale,
)

__all__ = ["SINK_CHECKS", "SOURCE_CHECKS", "SinkConformance", "SourceConformance"]

#: every source check by name, in the order the pytest suite runs them (for ``pytest.mark.parametrize``)
SOURCE_CHECKS: dict[str, Callable[[SourceCase], object]] = {
    "every_split_read_once": check_every_split_read_once,
    "bounded_end_of_input": check_bounded_end_of_input,
    "no_record_after_stop": check_no_record_after_stop,
    "reader_restore": check_reader_restore,
    "enumerator_restore": check_enumerator_restore,
    "rescale": check_rescale,
    "failed_reader_reassignment": check_failed_reader_reassignment,
    "serializers_round_trip": check_source_serializers,
    "exactly_once_in_a_job": check_source_in_a_job,
}

#: every sink check by name (recovery once per step of RECOVERY_STEPS)
SINK_CHECKS: dict[str, Callable[[SinkCase], object]] = {
    "nothing_visible_before_commit": check_nothing_visible_before_commit,
    "commit_idempotent": check_commit_idempotent,
    "abort_uncommitted": check_abort_uncommitted,
    "one_global_commit_per_checkpoint": check_one_global_commit_per_checkpoint,
    "serializers_round_trip": check_sink_serializers,
    **{
        f"recover_after_crash_at_{s}": (lambda case, s=s: check_recover_after_crash(case, s))  # type: ignore[misc]
        for s in RECOVERY_STEPS
    },
    "exactly_once_in_a_job": check_sink_in_a_job,
}


class SourceConformance:
    """The source contracts as pytest tests; a subclass provides the ``source_case`` fixture (a
    class-scoped one runs the failure-free read once for the first three tests)."""

    def test_every_split_read_once(self, source_case: SourceCase) -> None:
        check_every_split_read_once(source_case)

    def test_bounded_end_of_input(self, source_case: SourceCase) -> None:
        check_bounded_end_of_input(source_case)

    def test_no_record_after_stopping_position(self, source_case: SourceCase) -> None:
        check_no_record_after_stop(source_case)

    def test_reader_restore_at_checkpointed_positions(self, source_case: SourceCase) -> None:
        check_reader_restore(source_case)

    def test_enumerator_restore(self, source_case: SourceCase) -> None:
        check_enumerator_restore(source_case)

    def test_rescale_up_and_down(self, source_case: SourceCase) -> None:
        check_rescale(source_case)

    def test_split_reassignment_after_a_failed_reader(self, source_case: SourceCase) -> None:
        check_failed_reader_reassignment(source_case)

    def test_serializers_round_trip(self, source_case: SourceCase) -> None:
        check_source_serializers(source_case)

    def test_exactly_once_in_a_job_with_a_crash(self, source_case: SourceCase) -> None:
        check_source_in_a_job(source_case)


class SinkConformance:
    """The sink contracts as pytest tests; a subclass provides the ``sink_case`` fixture."""

    def test_nothing_visible_before_commit(self, sink_case: SinkCase) -> None:
        check_nothing_visible_before_commit(sink_case)

    def test_commit_idempotent_when_repeated(self, sink_case: SinkCase) -> None:
        check_commit_idempotent(sink_case)

    def test_recover_after_a_crash_at_write(self, sink_case: SinkCase) -> None:
        check_recover_after_crash(sink_case, "write")

    def test_recover_after_a_crash_at_prepare(self, sink_case: SinkCase) -> None:
        check_recover_after_crash(sink_case, "prepare")

    def test_recover_after_a_crash_at_snapshot(self, sink_case: SinkCase) -> None:
        check_recover_after_crash(sink_case, "snapshot")

    def test_recover_after_a_crash_in_commit(self, sink_case: SinkCase) -> None:
        check_recover_after_crash(sink_case, "commit")

    def test_recover_after_a_crash_after_commit(self, sink_case: SinkCase) -> None:
        check_recover_after_crash(sink_case, "after_commit")

    def test_abort_of_uncommitted_data(self, sink_case: SinkCase) -> None:
        check_abort_uncommitted(sink_case)

    def test_serializers_round_trip(self, sink_case: SinkCase) -> None:
        check_sink_serializers(sink_case)

    def test_exactly_once_in_a_job_with_a_crash(self, sink_case: SinkCase) -> None:
        check_sink_in_a_job(sink_case)

    def test_one_global_commit_per_checkpoint(self, sink_case: SinkCase) -> None:
        if not check_one_global_commit_per_checkpoint(sink_case):
            import pytest

            pytest.skip("not applicable: the sink commits per subtask (global_commit is False)")
