"""Drives a Sink's writers, compactors and committers in one thread, the way the engine does.

A :class:`SinkAttempt` is one attempt of a job with one sink at ``parallelism`` subtasks: before it
starts, ``Sink.recover`` gets the committables of the restored checkpoint and, for a global committer,
that checkpoint is committed again; then each subtask's writer (given its restored writer state) and
committer are created, and the restored per-subtask committables are committed again. A checkpoint goes
as in the engine: ``prepare_commit`` on every writer, committables routed by ``Compactor.key`` to a
compactor subtask when the sink compacts, writer snapshots, then on completion the per-subtask committers
(or the global committer, once) commit everything of checkpoints up to it.

A simulated crash is :class:`Crash`, raised from ``SinkContext.fault_hook("commit")`` when armed (sinks
call it in the middle of a commit) and otherwise by the checks between two steps; crashed writers are
abandoned without ``close()``, as a killed process leaves them.
"""

from __future__ import annotations

import copy
import zlib
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from sluice.errors import ConfigError
from sluice.serializers import SimpleVersionedSerializer
from sluice.sink import CommitOutcome, Committer, Compactor, GlobalCommitter, Sink, SinkWriter
from sluice.testing.conformance.contracts import SINK_CONTRACTS, ConformanceError, through_serializer

if TYPE_CHECKING:
    from sluice.state.spi import KeyedStateBackend

__all__ = ["Crash", "SinkAttempt", "SinkCheckpoint", "SinkTarget"]


def violation(contract: str, message: str) -> ConformanceError:
    """A ConformanceError of the sink contract ``contract`` (a key of SINK_CONTRACTS)."""
    return ConformanceError("sink", SINK_CONTRACTS[contract], message)


class Crash(BaseException):
    """A simulated crash (a BaseException: a crashing process runs no ``except Exception`` handler)."""


@dataclass
class SinkTarget:
    """One sink under test writing to its own, empty place.

    Args:
        sink: the sink.
        read_visible: what a downstream reader sees now (None or an empty table if nothing).
        staged: what the sink holds that readers do not see (pending or in-progress files, open
            uploads or transactions, data files no table snapshot names), as names; after recovery
            (``recover``, then the global committer's creation) it must hold nothing the restored checkpoint does not name.
        commits: the number of atomic commits the target has (e.g. table versions), for sinks with a
            global committer; None if the target cannot tell.
    """

    sink: Sink[Any]
    read_visible: Callable[[], pa.Table | None]
    staged: Callable[[], Collection[str]]
    commits: Callable[[], int] | None = None


@dataclass
class SinkCheckpoint:
    """What a completed checkpoint holds of the sink.

    Attributes:
        checkpoint_id: the checkpoint.
        writer_states: per writer subtask, its snapshot (after a round trip through the writer-state
            serializer).
        pending: per committing subtask, the committables not committed before this checkpoint.
        global_committables: what the global committer commits for this checkpoint.
        staged: ``SinkTarget.staged()`` when the checkpoint completed (before its commit).
    """

    checkpoint_id: int
    writer_states: dict[int, Any]
    pending: dict[int, list[Any]]
    global_committables: list[Any]
    staged: set[str] = field(default_factory=set)

    def committables(self) -> list[Any]:
        """Every committable of the checkpoint (what ``Sink.recover`` is given)."""
        return [c for s in sorted(self.pending) for c in self.pending[s]] + list(self.global_committables)


def _checkpointed(serializer: SimpleVersionedSerializer[Any], value: Any, what: str) -> Any:
    """``value`` after its trip through ``serializer`` into a checkpoint and back."""
    return through_serializer(serializer, value, what, lambda m: violation("serializers", m))


class _Ctx:
    """SinkContext / GlobalCommitterContext of the harness."""

    def __init__(self, attempt: SinkAttempt, subtask: int) -> None:
        self._a = attempt
        self._subtask = subtask

    @property
    def subtask(self) -> int:
        return self._subtask

    @property
    def parallelism(self) -> int:
        return self._a.parallelism

    @property
    def job_id(self) -> str:
        return self._a.job_id

    @property
    def attempt(self) -> int:
        return self._a.attempt

    @property
    def sink_uid(self) -> str:
        return "conformance-sink"

    @property
    def restored_checkpoint_id(self) -> int | None:
        return self._a.restored_checkpoint_id

    def keyed_state(self) -> KeyedStateBackend:
        raise ConfigError(
            "the sink conformance harness gives writers no keyed state: a sink with keyed_writer=True is tested "
            "through a pipeline (its state checkpointed and restored by the runtime)"
        )

    def metric(self, name: str, increment: int = 1) -> None:
        self._a.metrics[name] = self._a.metrics.get(name, 0) + increment

    def gauge(self, name: str, value: float) -> None:
        self._a.gauges[name] = value

    def fault_hook(self, point: str) -> None:
        if point == "commit" and self._a.crash_in_commit:
            self._a.crash_in_commit = False
            raise Crash("crash in the middle of a commit")


def check_outcome(outcome: object, who: str) -> CommitOutcome:
    """``outcome`` as a CommitOutcome, or a violation naming ``who``."""
    if not isinstance(outcome, CommitOutcome):
        raise violation(
            "outcome",
            f"{who} returned {outcome!r}; commit must return a CommitOutcome (COMMITTED, ALREADY_COMMITTED "
            "or RETRY_LATER) so the engine knows what happened",
        )
    return outcome


class SinkAttempt:
    """One attempt of a sink at ``parallelism`` subtasks (see the module docstring)."""

    def __init__(
        self,
        target: SinkTarget,
        parallelism: int,
        job_id: str,
        attempt: int,
        restored: SinkCheckpoint | None = None,
    ) -> None:
        self.target = target
        self.sink = target.sink
        self.parallelism = parallelism
        self.job_id = job_id
        self.attempt = attempt
        self.restored_checkpoint_id = restored.checkpoint_id if restored is not None else None
        self.metrics: dict[str, int] = {}
        self.gauges: dict[str, float] = {}
        self.crash_in_commit = False
        self.outcomes: list[CommitOutcome] = []
        #: per committing subtask: checkpoint id -> committables not committed yet
        self.pending: dict[int, dict[int, list[Any]]] = {i: {} for i in range(parallelism)}
        self.global_committer: GlobalCommitter[Any] | None = None
        self.recovered_staged: set[str] = set()
        self.sink.recover(job_id, restored.committables() if restored is not None else [])
        if self.sink.global_commit:
            self.global_committer = self.sink.create_global_committer(_Ctx(self, 0))
            if self.global_committer is None:
                raise violation(
                    "global_once", "global_commit is True but create_global_committer() returned None"
                )
            if restored is not None:
                self.commit_global(restored.checkpoint_id, restored.global_committables)
        # what recovery left staged: Sink.recover may abort orphans itself, or leave it to the global
        # committer, which knows the sink's uid (the Delta sink's application transaction)
        self.recovered_staged = set(target.staged())
        states = restored.writer_states if restored is not None else {}
        self.writers: list[SinkWriter[Any]] = [
            self.sink.create_writer(
                _Ctx(self, i), [copy.deepcopy(states[i])] if states.get(i) is not None else []
            )
            for i in range(parallelism)
        ]
        self.compactors: list[Compactor[Any] | None] = [
            self.sink.create_compactor(_Ctx(self, i)) if self.sink.compacts else None
            for i in range(parallelism)
        ]
        self.committers: list[Committer[Any] | None] = [
            self.sink.create_committer(_Ctx(self, i)) for i in range(parallelism)
        ]
        if not self.sink.global_commit and any(c is None for c in self.committers):
            raise violation(
                "publish",
                "create_committer() returned None for a sink without a global committer: nothing would "
                "ever make its data visible",
            )
        if restored is not None:
            for i, comms in restored.pending.items():
                if comms:
                    self.pending[i][restored.checkpoint_id] = list(comms)
            if not self.sink.global_commit:
                self.commit_upto(restored.checkpoint_id)

    # -- a checkpoint ---------------------------------------------------------------------------------
    def write(self, subtask: int, batch: pa.RecordBatch) -> None:
        self.writers[subtask].write(batch)

    def end_input(self) -> None:
        for w in self.writers:
            w.end_input()

    def prepare(self, checkpoint_id: int) -> None:
        """Pre-commit every writer; route committables through the compactors when the sink compacts."""
        made = {i: list(w.prepare_commit(checkpoint_id)) for i, w in enumerate(self.writers)}
        if not self.sink.compacts:
            for i, comms in made.items():
                if comms:
                    self.pending[i][checkpoint_id] = comms
            return
        routed: dict[int, dict[str, list[Any]]] = {i: {} for i in range(self.parallelism)}
        for comms in made.values():
            for c in comms:
                compactor = self.compactors[0]
                assert compactor is not None
                key = compactor.key(c)
                routed[zlib.crc32(key.encode()) % self.parallelism].setdefault(key, []).append(c)
        for i, groups in routed.items():
            compactor = self.compactors[i]
            assert compactor is not None
            out = [c for group in groups.values() for c in compactor.compact(checkpoint_id, group)]
            if out:
                self.pending[i][checkpoint_id] = out

    def snapshot(self, checkpoint_id: int) -> SinkCheckpoint:
        """Writer snapshots and the pending committables, as checkpoint ``checkpoint_id`` records them."""
        writer_states = self.sink.writer_state_serializer()
        states = {}
        for i, w in enumerate(self.writers):
            st = w.snapshot_state(checkpoint_id)
            states[i] = None if st is None else _checkpointed(writer_states, st, f"writer {i}'s snapshot")
        committables = self.sink.committable_serializer()
        pending = {
            i: [
                _checkpointed(committables, c, f"committable {c!r}")
                for k in sorted(p)
                if k <= checkpoint_id
                for c in p[k]
            ]
            for i, p in self.pending.items()
        }
        if self.sink.global_commit:
            return SinkCheckpoint(checkpoint_id, states, {}, [c for i in sorted(pending) for c in pending[i]])
        return SinkCheckpoint(checkpoint_id, states, pending, [])

    def complete(self, cp: SinkCheckpoint, commit: bool = True) -> None:
        """Checkpoint ``cp`` completed: note what is staged, then commit (globally or per subtask)."""
        cp.staged = set(self.target.staged())
        if not commit:
            return
        if self.sink.global_commit:
            self.commit_global(cp.checkpoint_id, cp.global_committables)
            for p in self.pending.values():
                for k in [k for k in p if k <= cp.checkpoint_id]:
                    del p[k]
        else:
            self.commit_upto(cp.checkpoint_id)

    def commit_upto(self, checkpoint_id: int, subtasks: Sequence[int] | None = None) -> None:
        for i in range(self.parallelism) if subtasks is None else subtasks:
            ready = sorted(k for k in self.pending[i] if k <= checkpoint_id)
            if not ready:
                continue
            committer = self.committers[i]
            assert committer is not None
            comms = [c for k in ready for c in self.pending[i][k]]
            self.outcomes.append(check_outcome(committer.commit(comms), f"the committer of subtask {i}"))
            for k in ready:
                del self.pending[i][k]

    def commit_global(self, checkpoint_id: int, committables: list[Any]) -> None:
        assert self.global_committer is not None
        outcome = self.global_committer.commit(checkpoint_id, list(committables))
        self.outcomes.append(check_outcome(outcome, "the global committer"))

    def cycle(
        self, checkpoint_id: int, data: dict[int, list[pa.RecordBatch]], last: bool = False
    ) -> SinkCheckpoint:
        """Write ``data`` (per subtask), then checkpoint ``checkpoint_id`` completes and commits."""
        for i, batches in data.items():
            for b in batches:
                self.write(i, b)
        if last:
            self.end_input()
        self.prepare(checkpoint_id)
        cp = self.snapshot(checkpoint_id)
        self.complete(cp)
        return cp

    def close(self) -> None:
        """Close writers, compactors and committers (a clean end of the attempt)."""
        for part in [*self.writers, *self.compactors, *self.committers]:
            if part is not None:
                try:
                    part.close()
                except Exception:
                    pass
