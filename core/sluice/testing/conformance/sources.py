"""The source checks of the conformance kit: one function per contract, each taking a :class:`SourceCase`.

A case is a *bounded* source under test and the records it must emit, exactly once, identified by
``columns``. Each check drives the source through :class:`~sluice.testing.conformance.source_harness.SourceRun`
(enumerator and readers in one thread, snapshots through pickle, as the engine does), crashes and restores
it where its contract says, and compares what a downstream operator would have received (records emitted
before the restored checkpoint, then everything after the restore) with the expected records.

So that :func:`check_no_record_after_stop` can catch a reader that reads past its split's end, the
external system should hold records beyond the stopping positions (for Kafka: stop before the end offsets).
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from sluice.errors import ConfigError
from sluice.source import Boundedness, Source
from sluice.testing.conformance.contracts import (
    SOURCE_CONTRACTS,
    ConformanceError,
    attributed,
    diff_records,
    row_counts,
)
from sluice.testing.conformance.source_harness import SourceCheckpoint, SourceRun, violation

__all__ = [
    "SourceCase",
    "check_bounded_end_of_input",
    "check_enumerator_restore",
    "check_every_split_read_once",
    "check_failed_reader_reassignment",
    "check_no_record_after_stop",
    "check_reader_restore",
    "check_rescale",
]


@dataclass
class SourceCase:
    """A bounded source under test and what it must emit.

    Args:
        source: the source, configured to end (e.g. Kafka with ``stopping_offsets``).
        expected: every record it must emit, once each (a table or batches).
        columns: the columns that identify a record (default: all columns of ``expected``).
        parallelism: reader subtasks (restores also run at one more and one fewer).
        stall_timeout_s: how long the harness waits for a reader that makes no progress before it fails
            the check naming the readers that never ended (a bound against hangs, not a speed target).
    """

    source: Source
    expected: pa.Table | Sequence[pa.RecordBatch]
    columns: Sequence[str] | None = None
    parallelism: int = 2
    stall_timeout_s: float = 60.0
    _full: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.source, Source):
            raise ConfigError(
                f"SourceCase: source must be a sluice Source (got {type(self.source).__name__})"
            )
        if self.source.boundedness is not Boundedness.BOUNDED:
            raise ConfigError(
                "SourceCase: the source must be bounded (its splits end), so a run ends and its records "
                "can be compared; configure stopping positions (Kafka: stopping_offsets)"
            )
        if not isinstance(self.parallelism, int) or self.parallelism < 1:
            raise ConfigError(f"SourceCase: parallelism must be an integer >= 1 (got {self.parallelism!r})")

    @functools.cached_property
    def expected_counts(self) -> collections.Counter[str]:
        batches = [self.expected] if isinstance(self.expected, pa.Table) else list(self.expected)
        return row_counts(batches, self.identifying_columns)

    @property
    def identifying_columns(self) -> list[str]:
        if self.columns is not None:
            return list(self.columns)
        return list(
            self.expected.schema.names
            if isinstance(self.expected, pa.Table)
            else self.expected[0].schema.names
        )

    @property
    def total(self) -> int:
        return sum(self.expected_counts.values())

    def run(self, parallelism: int | None = None, restored: SourceCheckpoint | None = None) -> SourceRun:
        """A new attempt (not started)."""
        return SourceRun(
            self.source,
            parallelism or self.parallelism,
            restored=restored,
            stall_timeout_s=self.stall_timeout_s,
        )


def _counts(case: SourceCase, batches: list[pa.RecordBatch]) -> collections.Counter[str]:
    return row_counts(batches, case.identifying_columns)


# -- a failure-free run -----------------------------------------------------------------------------------
def _full_run(case: SourceCase) -> collections.Counter[str]:
    """What a failure-free run emits (run once per case; a failure is re-raised by every check using it)."""
    if case._full is None:
        run = case.run().start()
        try:
            run.run_to_end()
            case._full = _counts(case, [b for r in run.readers.values() for b in r.output.batches])
        except ConformanceError as exc:
            case._full = exc
        finally:
            run.close()
    if isinstance(case._full, ConformanceError):
        raise case._full
    return case._full  # type: ignore[no-any-return]


def check_every_split_read_once(case: SourceCase) -> None:
    """A failure-free run emits every expected record, and none twice."""
    d = diff_records(case.expected_counts, _full_run(case))
    if d.missing or d.duplicated:
        raise violation(
            "split_once",
            f"a failure-free run at parallelism {case.parallelism}: {d.describe()}. Every split must be "
            "assigned to a reader (none forgotten by the enumerator) and read once to its end.",
        )


def check_bounded_end_of_input(case: SourceCase) -> None:
    """Every reader of a bounded source returns END_OF_INPUT, only after it was told 'no more splits'."""
    _full_run(case)  # the harness raises if a reader ends early or never ends


def check_no_record_after_stop(case: SourceCase) -> None:
    """No reader emits a record beyond its split's stopping position."""
    d = diff_records(case.expected_counts, _full_run(case))
    if d.unexpected:
        raise violation(
            "stop_position",
            f"{d.describe()}. A bounded split ends at its stopping position (exclusive): records after it "
            "belong to no bounded run.",
        )


# -- restores -------------------------------------------------------------------------------------------
def _crash(run: SourceRun, cp: SourceCheckpoint) -> list[pa.RecordBatch]:
    """Close the attempt; return what downstream keeps of it: every reader's output up to the checkpoint."""
    kept = [b for s, r in run.readers.items() for b in r.output.batches[: cp.emitted.get(s, 0)]]
    run.close()
    return kept


def _progress(run: SourceRun, rounds: int = 2) -> None:
    for _ in range(rounds):
        if run.finished:
            return
        run.round()


def _compare(case: SourceCase, contract: str, batches: list[pa.RecordBatch], when: str, rule: str) -> None:
    d = diff_records(case.expected_counts, _counts(case, batches))
    if not d.ok:
        raise violation(contract, f"{when}: {d.describe()}. {rule}")


def _at(case: SourceCase, fraction: float) -> Callable[[SourceRun], bool]:
    target = fraction * case.total
    return lambda run: run.emitted_records() >= target


def _signalled_and(reached: Callable[[SourceRun], bool]) -> Callable[[SourceRun], bool]:
    return lambda run: reached(run) and all(r.signalled for r in run.readers.values())


def check_reader_restore(case: SourceCase) -> None:
    """Readers restored from a checkpoint resume exactly at their positions: nothing read twice or skipped.

    The enumerator is not restored here (only the readers are), so a failure is the readers' positions.
    Checkpoints are taken once every reader has its splits, at 0, 1/3 and 2/3 of the records.
    """
    for fraction in (0.0, 1 / 3, 2 / 3):
        run = case.run().start()
        try:
            run.run_until(_signalled_and(_at(case, fraction)))
            cp = run.checkpoint(1)
            old = dict(run.readers)
            _progress(run)
            kept = [b for s, r in old.items() for b in r.output.batches[: cp.emitted[s]]]
            for r in old.values():
                run._close_reader(r)
            run.readers.clear()
            fresh = []
            when = (
                f"after restoring the readers from a checkpoint taken at {cp_records(cp, old)} of "
                f"{case.total} records"
            )
            with attributed("source", SOURCE_CONTRACTS["reader_restore"], when):
                for s, r in sorted(old.items()):
                    nr = run.add_restored_reader(s)
                    splits = [*cp.splits[s], *cp.since.get(s, [])]
                    nr.owned = {x.split_id for x in splits}
                    nr.inbox.append(("splits", splits))
                    if r.signalled:
                        nr.signalled = True
                        nr.inbox.append(("no_more", []))
                    fresh.append(nr)
                run.run_to_end()
            _compare(
                case,
                "reader_restore",
                kept + [b for r in fresh for b in r.output.batches],
                when,
                "A split's snapshotted position is where reading resumes: the record after the last one "
                "emitted (not the last one itself, nor one fetched but not emitted yet).",
            )
        finally:
            run.close()


def cp_records(cp: SourceCheckpoint, readers: dict[int, Any]) -> int:
    """Records emitted before checkpoint ``cp`` by ``readers``."""
    return sum(b.num_rows for s, r in readers.items() for b in r.output.batches[: cp.emitted.get(s, 0)])


def _restore_check(
    case: SourceCase,
    contract: str,
    plans: list[tuple[str, Callable[[SourceRun], bool], list[int] | None, int]],
    rule: str,
) -> None:
    """For each plan (label, checkpoint when, readers registered first, parallelism after): checkpoint,
    go on a little, crash, restore enumerator and readers at that parallelism, run to the end, compare."""
    for label, checkpoint_when, first, parallelism in plans:
        run = case.run().start(first)
        restored: SourceRun | None = None
        try:
            if first is None:
                run.run_until(checkpoint_when, "the checkpoint")
            cp = run.checkpoint(1)
            at = cp_records(cp, run.readers)
            _progress(run)
            kept = _crash(run, cp)
            when = (
                f"{label} (checkpoint at {at} of {case.total} records, restored at parallelism {parallelism})"
            )
            with attributed("source", SOURCE_CONTRACTS[contract], when):
                restored = case.run(parallelism, restored=cp).start()
                restored.run_to_end()
            got = kept + [b for r in restored.readers.values() for b in r.output.batches]
            _compare(case, contract, got, when, rule)
        finally:
            run.close()
            if restored is not None:
                restored.close()


def check_enumerator_restore(case: SourceCase) -> None:
    """An enumerator restored from its snapshot, given the readers' splits back, loses and repeats nothing:
    once with a checkpoint taken while only reader 0 was registered (the enumerator still holds the
    others' splits), once in the middle of the input."""
    p = case.parallelism
    early = list(range(min(1, p - 1)))
    _restore_check(
        case,
        "enumerator_restore",
        [
            (
                f"a checkpoint taken before reader(s) {list(range(len(early), p))} registered",
                _at(case, 0),
                early,
                p,
            ),
            ("a checkpoint in the middle of the input", _at(case, 0.5), None, p),
        ],
        "The enumerator's snapshot must hold every split it has not assigned yet, and add_splits_back() "
        "must assign again the splits the readers had.",
    )


def check_rescale(case: SourceCase) -> None:
    """Restored at one more and one fewer reader, every split is read exactly once from its position."""
    p = case.parallelism
    targets = [p + 1, p - 1] if p > 1 else [p + 1, p + 2]
    _restore_check(
        case,
        "rescale",
        [(f"rescaled from {p} to {t} readers", _at(case, 0.5), None, t) for t in targets],
        "After a restore at another parallelism the enumerator must spread the handed-back splits over "
        "the new readers (only subtasks below the new parallelism) and tell each 'no more splits'.",
    )


def check_failed_reader_reassignment(case: SourceCase) -> None:
    """A reader fails; its splits (as of the last checkpoint) go back to the running enumerator, which
    assigns them again to the reader registered in its place; the other readers go on."""
    p = case.parallelism
    subtask = p - 1
    run = case.run().start()
    try:
        reached = _at(case, 1 / 3)
        run.run_until(lambda r: reached(r) and r.readers[subtask].owned != set(), "the checkpoint")
        cp = run.checkpoint(1)
        _progress(run)
        failed, back = run.fail_reader(subtask)
        when = (
            f"reader {subtask} failed after a checkpoint; its {len(back)} split(s) went back to the running "
            "enumerator and a new reader registered"
        )
        with attributed("source", SOURCE_CONTRACTS["reassignment"], when):
            if back:
                run.enumerator.add_splits_back(back)
            run.add_reader(subtask)
            run.run_to_end()
        kept = failed.output.batches[: cp.emitted.get(subtask, 0)]
        got = kept + [b for r in run.readers.values() for b in r.output.batches]
        _compare(
            case,
            "reassignment",
            got,
            when,
            "add_splits_back() on a running enumerator must assign those splits again, and a reader "
            "registered again (add_reader) must be told 'no more splits' again once it has all of them.",
        )
    finally:
        run.close()
