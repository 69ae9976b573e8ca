"""The serializer checks of the conformance kit: what a connector puts into checkpoints comes back.

A source's splits and enumerator state, a sink's committables and writer state are written into
checkpoints by the connector's versioned serializers (:mod:`sluice.serializers`). The harnesses send every
snapshot through them (``deserialize(version, serialize(x))``, as a checkpoint and its restore do) and fail
the contract when what comes back differs (unequal, and not even serializing to the same bytes). These
checks exercise them at the start, in the middle and at the end of a run, where a state is empty, partial
and final.
"""

from __future__ import annotations

from sluice.testing.conformance.contracts import SINK_CONTRACTS, SOURCE_CONTRACTS, attributed
from sluice.testing.conformance.sink_harness import SinkAttempt
from sluice.testing.conformance.sinks import SinkCase
from sluice.testing.conformance.sources import SourceCase

__all__ = ["check_sink_serializers", "check_source_serializers"]


def check_source_serializers(case: SourceCase) -> None:
    """Splits and enumerator state round-trip through the source's serializers before, during and after
    a read (positions, stop positions and any extra state of a split subclass included)."""
    with attributed("source", SOURCE_CONTRACTS["serializers"], "while the kit read the source", others=False):
        run = case.run().start()
        try:
            run.checkpoint(1)
            run.round()
            run.checkpoint(2)
            run.run_to_end()
            run.checkpoint(3)
        finally:
            run.close()


def check_sink_serializers(case: SinkCase) -> None:
    """Committables and writer states round-trip through the sink's serializers at every checkpoint of a
    run, the final one (after end of input) included."""
    with attributed("sink", SINK_CONTRACTS["serializers"], "while the kit drove the sink", others=False):
        a = SinkAttempt(case.target(), case.parallelism, "conformance-serializers", 1)
        try:
            for k in range(1, case.rounds + 1):
                a.cycle(k, case.data(k), last=k == case.rounds)
        finally:
            a.close()
