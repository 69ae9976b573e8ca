"""Drives a Source's enumerator and readers in one thread, the way the engine does, without the engine.

A :class:`SourceRun` is one attempt: an enumerator (fresh or restored from a snapshot) and one reader per
subtask. It mirrors the engine's ordering: split assignments and "no more splits" reach a reader through
its mailbox (:attr:`ReaderRecord.inbox`) and are handled before its next poll and before a checkpoint
snapshot (so an assignment made before a checkpoint is in the reader's snapshot, not the enumerator's);
split requests reach the enumerator after the poll that made them. Snapshots go through the source's
serializers as they do into a checkpoint (assignments through ``pickle``, as they travel to a Spark slot).
A round polls every live reader once.

The harness itself checks the contracts it can see at every step: splits go only to registered readers,
one owner each; a reader ends only after "no more splits"; snapshots round-trip through the source's
serializers and name only owned splits.
"""

from __future__ import annotations

import collections
import copy
import pickle
import time
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from sluice.serializers import SimpleVersionedSerializer
from sluice.source import InputStatus, Source, SourceSplit, SplitEnumerator
from sluice.testing.conformance.contracts import SOURCE_CONTRACTS, ConformanceError, through_serializer
from sluice.testing.conformance.source_records import ReaderOutput, ReaderRecord, SourceCheckpoint

__all__ = ["SourceCheckpoint", "SourceRun"]


def violation(contract: str, message: str) -> ConformanceError:
    """A ConformanceError of the source contract ``contract`` (a key of SOURCE_CONTRACTS)."""
    return ConformanceError("source", SOURCE_CONTRACTS[contract], message)


def _roundtrip(value: Any, what: str) -> Any:
    try:
        return pickle.loads(pickle.dumps(value))
    except Exception as exc:
        raise violation("snapshot", f"{what} cannot be pickled to a Spark slot: {exc!r}") from exc


def _checkpointed(serializer: SimpleVersionedSerializer[Any], value: Any, what: str) -> Any:
    return through_serializer(serializer, value, what, lambda m: violation("serializers", m))


class _ReaderCtx:
    def __init__(self, run: SourceRun, subtask: int) -> None:
        self._run = run
        self._subtask = subtask

    @property
    def subtask(self) -> int:
        return self._subtask

    @property
    def parallelism(self) -> int:
        return self._run.parallelism

    @property
    def job_id(self) -> str:
        return self._run.job_id

    def request_split(self) -> None:
        self._run.requests.append(self._subtask)

    def metric(self, name: str, increment: int = 1) -> None:
        self._run.metrics[name] += increment

    def gauge(self, name: str, value: float) -> None:
        self._run.gauges[name] = value

    def stalled(self, reason: str | None) -> None:
        pass


class _EnumeratorCtx:
    def __init__(self, run: SourceRun) -> None:
        self._run = run

    @property
    def parallelism(self) -> int:
        return self._run.parallelism

    def assign_splits(self, assignment: dict[int, list[SourceSplit]]) -> None:
        self._run.on_assign(assignment)

    def signal_no_more_splits(self, subtask: int) -> None:
        self._run.on_no_more(subtask)

    def registered_readers(self) -> Sequence[int]:
        return sorted(self._run.readers)


class SourceRun:
    """One attempt of a source: its enumerator and readers, driven round by round.

    Args:
        source: the source under test.
        parallelism: number of reader subtasks.
        job_id: the job id readers see.
        restored: a checkpoint to restore the enumerator from (its splits are handed back to it), or None.
        stall_timeout_s: a run in which no reader emitted or ended for this long (and for at least 1000
            rounds) has stalled: the check fails naming the readers that never ended.
    """

    def __init__(
        self,
        source: Source,
        parallelism: int,
        job_id: str = "conformance",
        restored: SourceCheckpoint | None = None,
        stall_timeout_s: float = 60.0,
    ) -> None:
        self.source = source
        self.parallelism = parallelism
        self.job_id = job_id
        self.stall_timeout_s = stall_timeout_s
        self.readers: dict[int, ReaderRecord] = {}
        self.retired: list[ReaderRecord] = []
        self.requests: list[int] = []
        self.metrics: collections.Counter[str] = collections.Counter()
        self.gauges: dict[str, float] = {}
        self.checkpoints: list[SourceCheckpoint] = []
        self.rounds = 0
        self._restored = restored
        self.enumerator: SplitEnumerator = source.create_enumerator(
            _EnumeratorCtx(self), copy.deepcopy(restored.enumerator) if restored is not None else None
        )

    # -- lifecycle -------------------------------------------------------------------------------------
    def start(self, readers: Sequence[int] | None = None) -> SourceRun:
        """Start the enumerator, hand back restored splits, register ``readers`` (default: all)."""
        self.enumerator.start()
        if self._restored is not None:
            splits = self._restored.all_splits()
            if splits:
                self.enumerator.add_splits_back(splits)
        for i in range(self.parallelism) if readers is None else readers:
            self.add_reader(i)
        return self

    def add_reader(self, subtask: int) -> ReaderRecord:
        """Create, start and register the reader of ``subtask`` (as a restarted subtask does)."""
        r = self.add_restored_reader(subtask)
        self.enumerator.add_reader(subtask)
        return r

    def add_restored_reader(self, subtask: int) -> ReaderRecord:
        """Create and start the reader of ``subtask`` without telling the enumerator (the caller hands it
        its splits)."""
        r = ReaderRecord(subtask, self.source.create_reader(_ReaderCtx(self, subtask)), ReaderOutput())
        r.reader.start()
        self.readers[subtask] = r
        return r

    def close(self) -> None:
        """Close every reader and the enumerator (as a cancelled or crashed attempt's tasks are)."""
        for r in list(self.readers.values()):
            self._close_reader(r)
        self.readers.clear()
        try:
            self.enumerator.close()
        except Exception:
            pass

    def _close_reader(self, r: ReaderRecord) -> None:
        try:
            r.reader.close()
        except Exception:
            pass

    # -- what the enumerator does ----------------------------------------------------------------------
    def on_assign(self, assignment: dict[int, list[SourceSplit]]) -> None:
        for subtask, splits in assignment.items():
            if not splits:
                continue
            ids = [s.split_id for s in splits]
            if subtask not in self.readers:
                raise violation(
                    "assignment",
                    f"the enumerator assigned split(s) {ids} to subtask {subtask}, which is not a registered "
                    f"reader (registered: {sorted(self.readers)}; parallelism {self.parallelism}). Assign only "
                    "to readers add_reader() announced, below the context's parallelism.",
                )
            if self.readers[subtask].ended:
                raise violation(
                    "assignment",
                    f"the enumerator assigned split(s) {ids} to subtask {subtask}, whose reader already "
                    "returned END_OF_INPUT after it was told 'no more splits': their records are never read.",
                )
            for sid in ids:
                owner = next((r.subtask for r in self.readers.values() if sid in r.owned), None)
                if owner is not None:
                    raise violation(
                        "assignment",
                        f"the enumerator assigned split {sid!r} to subtask {subtask} while subtask {owner} "
                        "still reads it: a split has one owner at a time, or its records are read twice.",
                    )
            r = self.readers[subtask]
            r.owned.update(ids)
            copies = _roundtrip(list(splits), f"splits {ids}")
            r.inbox.append(("splits", copies))
            for cp in self.checkpoints:
                cp.since.setdefault(subtask, []).extend(copy.deepcopy(copies))

    def on_no_more(self, subtask: int) -> None:
        if subtask not in self.readers:
            raise violation(
                "assignment",
                f"the enumerator signalled 'no more splits' to subtask {subtask}, which is not a registered "
                f"reader (registered: {sorted(self.readers)})",
            )
        self.readers[subtask].signalled = True
        self.readers[subtask].inbox.append(("no_more", []))

    # -- rounds ----------------------------------------------------------------------------------------
    def _deliver(self, r: ReaderRecord, everything: bool = False) -> None:
        """Hand the reader its mailbox, in order. 'No more splits' waits (unless ``everything``, as before
        a snapshot) until the reader has said NOTHING_AVAILABLE once since its last splits: the signal may
        come late, and a reader that ends without it is caught."""
        while r.inbox:
            kind, splits = r.inbox[0]
            if kind == "no_more" and not (r.idle or everything):
                return
            r.inbox.popleft()
            if kind == "splits":
                r.idle = False
                r.reader.add_splits(splits)
            else:
                r.no_more = True
                r.reader.notify_no_more_splits()

    def round(self) -> bool:
        """Poll every live reader once; True if any emitted or ended."""
        progress = False
        self.rounds += 1
        for subtask in sorted(self.readers):
            r = self.readers.get(subtask)
            if r is None:
                continue
            self._deliver(r)
            if r.ended:
                continue
            before = len(r.output.batches)
            status = r.reader.poll_next(r.output)
            if len(r.output.batches) != before:
                progress = True
            if status is InputStatus.NOTHING_AVAILABLE:
                if not r.idle and r.inbox:
                    progress = True  # a held-back 'no more splits' goes in next round
                r.idle = True
            if status is InputStatus.END_OF_INPUT:
                if not r.no_more:
                    raise violation(
                        "bounded_end",
                        f"reader {subtask} returned END_OF_INPUT before it was told 'no more splits': more "
                        "splits could still come. End only after notify_no_more_splits() and once every "
                        "split reached its end.",
                    )
                r.ended = True
                progress = True
            while self.requests:
                self.enumerator.handle_split_request(self.requests.pop(0))
        return progress

    @property
    def finished(self) -> bool:
        return all(r.ended for r in self.readers.values())

    def emitted_records(self) -> int:
        return sum(b.num_rows for r in [*self.readers.values(), *self.retired] for b in r.output.batches)

    def run_until(self, done: Callable[[SourceRun], bool], what: str = "the end of input") -> None:
        """Run rounds until ``done(self)`` (or every reader ended); fail naming the readers if progress
        stalls."""
        idle_rounds = 0
        last = time.monotonic()
        while not done(self) and not self.finished:
            if self.round():
                idle_rounds, last = 0, time.monotonic()
                continue
            idle_rounds += 1
            if idle_rounds >= 1000 and time.monotonic() - last > self.stall_timeout_s:
                waiting = sorted(s for s, r in self.readers.items() if not r.ended)
                told = sorted(s for s in waiting if self.readers[s].no_more)
                raise violation(
                    "bounded_end",
                    f"no reader emitted anything for {self.stall_timeout_s:.1f}s ({idle_rounds} rounds) "
                    f"before {what}; reader(s) {waiting} never returned END_OF_INPUT (of them, {told} were "
                    "told 'no more splits'). A bounded reader ends once it was told 'no more splits' and "
                    "each of its splits reached its end.",
                )

    def run_to_end(self) -> None:
        self.run_until(lambda _: False)

    # -- checkpoints and failures ----------------------------------------------------------------------
    def checkpoint(self, checkpoint_id: int) -> SourceCheckpoint:
        """Snapshot the enumerator, then every reader (after its mailbox), as one checkpoint."""
        enum_state = _checkpointed(
            self.source.enumerator_state_serializer(),
            self.enumerator.snapshot_state(checkpoint_id),
            "the enumerator's snapshot",
        )
        split_serializer = self.source.split_serializer()
        splits: dict[int, list[SourceSplit]] = {}
        for subtask, r in sorted(self.readers.items()):
            self._deliver(r, everything=True)
            snap = [
                _checkpointed(split_serializer, s, f"split {s.split_id!r} of reader {subtask}'s snapshot")
                for s in r.reader.snapshot_state(checkpoint_id)
            ]
            foreign = sorted({s.split_id for s in snap} - r.owned)
            if foreign:
                raise violation(
                    "snapshot",
                    f"reader {subtask}'s snapshot names split(s) {foreign} that were never assigned to it: "
                    "after a restore they would be read twice.",
                )
            splits[subtask] = snap
        cp = SourceCheckpoint(
            checkpoint_id,
            enum_state,
            splits,
            {s: len(r.output.batches) for s, r in self.readers.items()},
            no_more={s for s, r in self.readers.items() if r.no_more},
        )
        self.checkpoints.append(cp)
        return cp

    def fail_reader(self, subtask: int) -> tuple[ReaderRecord, list[SourceSplit]]:
        """Reader ``subtask`` fails: it is closed and its splits as of the last checkpoint (plus those
        assigned to it since) are returned, as Flink's split assignment tracker hands them back."""
        r = self.readers.pop(subtask)
        self._close_reader(r)
        self.retired.append(r)
        cp = self.checkpoints[-1]
        back = [copy.deepcopy(s) for s in cp.splits.get(subtask, [])] + list(cp.since.get(subtask, []))
        return r, back

    def output_of(self, r: ReaderRecord, upto: int | None = None) -> list[pa.RecordBatch]:
        return list(r.output.batches[:upto])
