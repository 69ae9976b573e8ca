"""The connector conformance kit: checks that a Source or a Sink keeps the contracts of its SPI.

Give the kit the connector under test, not the other way round: the kit imports no connector or sink.

* Sources (:class:`SourceCase`: a bounded source and the records it must emit): every split read exactly
  once, bounded end of input, no record after the stopping position, reader restore at checkpointed
  positions, enumerator restore, rescale up and down, split re-assignment after a failed reader, splits
  and enumerator state round-tripping through the source's serializers.
* Sinks (:class:`SinkCase`: a factory of :class:`SinkTarget`, a sink on its own empty place with a way to
  read what is visible and what is staged): nothing visible before commit, commit idempotent and
  reporting its :class:`~sluice.sink.CommitOutcome`, recover after a crash at each lifecycle step
  (:data:`RECOVERY_STEPS`), abort of uncommitted data, one global commit per checkpoint, committables and
  writer state round-tripping through the sink's serializers.
* Both, inside a real job (the in-process runtime, one injected crash, a restore): exactly once.

Use the ``check_*`` functions directly, the :data:`SOURCE_CHECKS` / :data:`SINK_CHECKS` tables with
``pytest.mark.parametrize``, or subclass :class:`SourceConformance` / :class:`SinkConformance`. A broken
contract raises :class:`ConformanceError` whose message starts with ``[source: <contract>]`` or
``[sink: <contract>]``. See docs/connectors.md.
"""

from sluice.testing.conformance.contracts import SINK_CONTRACTS, SOURCE_CONTRACTS, ConformanceError
from sluice.testing.conformance.jobs import check_sink_in_a_job, check_source_in_a_job
from sluice.testing.conformance.serializers import check_sink_serializers, check_source_serializers
from sluice.testing.conformance.sink_harness import SinkTarget
from sluice.testing.conformance.sinks import (
    RECOVERY_STEPS,
    SinkCase,
    check_abort_uncommitted,
    check_commit_idempotent,
    check_nothing_visible_before_commit,
    check_one_global_commit_per_checkpoint,
    check_recover_after_crash,
    sample_batch,
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
from sluice.testing.conformance.suites import SINK_CHECKS, SOURCE_CHECKS, SinkConformance, SourceConformance

__all__ = [
    "RECOVERY_STEPS",
    "SINK_CHECKS",
    "SINK_CONTRACTS",
    "SOURCE_CHECKS",
    "SOURCE_CONTRACTS",
    "ConformanceError",
    "SinkCase",
    "SinkConformance",
    "SinkTarget",
    "SourceCase",
    "SourceConformance",
    "check_abort_uncommitted",
    "check_bounded_end_of_input",
    "check_commit_idempotent",
    "check_enumerator_restore",
    "check_every_split_read_once",
    "check_failed_reader_reassignment",
    "check_no_record_after_stop",
    "check_nothing_visible_before_commit",
    "check_one_global_commit_per_checkpoint",
    "check_reader_restore",
    "check_recover_after_crash",
    "check_rescale",
    "check_sink_in_a_job",
    "check_sink_serializers",
    "check_source_in_a_job",
    "check_source_serializers",
    "sample_batch",
]
