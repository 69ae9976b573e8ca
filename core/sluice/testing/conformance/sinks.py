"""The sink checks of the conformance kit: one function per contract, each taking a :class:`SinkCase`.

A case makes a fresh :class:`~sluice.testing.conformance.sink_harness.SinkTarget` per check (a sink
writing to its own empty place, with a way to read what is visible and what is staged). The checks
write rounds of batches at ``parallelism`` subtasks through
:class:`~sluice.testing.conformance.sink_harness.SinkAttempt` (the engine's lifecycle in one thread),
crash where the contract says, recover as the engine does, and compare what a reader sees with what the
completed checkpoints hold. Checkpoint ids only grow across attempts, as in the engine.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable
from typing import Any, TypeVar

from sluice.errors import ConfigError
from sluice.sink import CommitOutcome
from sluice.testing.conformance.contracts import SINK_CONTRACTS, attributed, row_counts
from sluice.testing.conformance.sink_case import SinkCase, sample_batch
from sluice.testing.conformance.sink_harness import Crash, SinkAttempt, SinkCheckpoint, SinkTarget, violation

__all__ = [
    "RECOVERY_STEPS",
    "SinkCase",
    "check_abort_uncommitted",
    "check_commit_idempotent",
    "check_nothing_visible_before_commit",
    "check_one_global_commit_per_checkpoint",
    "check_recover_after_crash",
    "sample_batch",
]

#: where :func:`check_recover_after_crash` crashes, in lifecycle order
RECOVERY_STEPS = ("write", "prepare", "snapshot", "commit", "after_commit")

F = TypeVar("F", bound=Callable[..., Any])


def _contract(contract: str) -> Callable[[F], F]:
    """An exception the sink raises inside the check is reported as a breach of ``contract``."""

    def deco(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with attributed("sink", SINK_CONTRACTS[contract], "while the kit drove the sink", others=False):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return deco


def _visible(case: SinkCase, t: SinkTarget) -> collections.Counter[str]:
    table = t.read_visible()
    return row_counts([table] if table is not None else [], case.columns)


def _examples(rows: collections.Counter[str], n: int = 3) -> str:
    return ", ".join(sorted(rows)[:n])


def _expect(
    case: SinkCase,
    t: SinkTarget,
    allowed: collections.Counter[str],
    contract: str,
    when: str,
    exact: bool = False,
    at_least: collections.Counter[str] | None = None,
) -> collections.Counter[str]:
    """What is visible must be within ``allowed`` (``contract`` names a breach); all of ``at_least``
    (default: ``allowed`` if ``exact``) must be visible (else the commit did not publish)."""
    seen = _visible(case, t)
    extra = seen - allowed
    if extra:
        raise violation(
            contract,
            f"{when}: a reader sees {sum(extra.values())} record(s) it must not (e.g. {_examples(extra)}): "
            "data of a checkpoint that did not complete, or published twice.",
        )
    need = allowed if exact and at_least is None else at_least
    missing = (need or collections.Counter()) - seen
    if missing:
        raise violation(
            "publish",
            f"{when}: {sum(missing.values())} committed record(s) are not visible (e.g. {_examples(missing)}).",
        )
    return seen


@_contract("invisible")
def check_nothing_visible_before_commit(case: SinkCase) -> None:
    """Data a writer got stays invisible through write, prepare_commit and snapshot until its checkpoint
    commits; then it is visible (at the latest after the final checkpoint, for sinks that hold data back)."""
    t = case.target()
    a = SinkAttempt(t, case.parallelism, "conformance-visible", 1)
    committed: collections.Counter[str] = collections.Counter()
    for k in range(1, case.rounds + 1):
        last = k == case.rounds
        for i, batches in case.data(k).items():
            for b in batches:
                a.write(i, b)
        _expect(case, t, committed, "invisible", f"after write() of checkpoint {k}")
        if last:
            a.end_input()
        a.prepare(k)
        _expect(case, t, committed, "invisible", f"after prepare_commit({k})")
        cp = a.snapshot(k)
        _expect(
            case, t, committed, "invisible", f"after snapshot_state({k}), before checkpoint {k} completed"
        )
        a.complete(cp)
        committed += case.expected([k])
        _expect(case, t, committed, "invisible", f"after checkpoint {k} committed", exact=last)
    a.close()


def _recommit_outcomes(a: SinkAttempt, start: int, who: str) -> None:
    wrong = [o for o in a.outcomes[start:] if o is not CommitOutcome.ALREADY_COMMITTED]
    if wrong:
        raise violation(
            "outcome",
            f"{who} returned {[o.name for o in wrong]} for committables that were all visible already: "
            "it must return ALREADY_COMMITTED (the engine counts these apart after a restore)",
        )


@_contract("idempotent")
def check_commit_idempotent(case: SinkCase) -> None:
    """Committing the same committables again (same committer, then a new one as after a restore) changes
    nothing a reader sees and reports ALREADY_COMMITTED; the first commit reports COMMITTED."""
    t = case.target()
    a = SinkAttempt(t, case.parallelism, "conformance-idempotent", 1)
    cp = a.cycle(1, case.data(1), last=True)
    if any(o is not CommitOutcome.COMMITTED for o in a.outcomes):
        raise violation(
            "outcome",
            f"the first commit of checkpoint 1 returned {[o.name for o in a.outcomes]}, but it published the "
            "checkpoint's data: it must return COMMITTED",
        )
    want = case.expected([1])
    _expect(case, t, want, "idempotent", "after checkpoint 1 committed", exact=True)
    start = len(a.outcomes)
    if a.sink.global_commit:
        a.commit_global(cp.checkpoint_id, cp.global_committables)
    else:
        for i, comms in cp.pending.items():
            a.pending[i][cp.checkpoint_id] = list(comms)
        a.commit_upto(cp.checkpoint_id)
    _expect(case, t, want, "idempotent", "after the same committer committed checkpoint 1 again", exact=True)
    _recommit_outcomes(a, start, "committing checkpoint 1 again")
    a.close()
    b = SinkAttempt(t, case.parallelism, "conformance-idempotent", 2, restored=cp)
    _expect(
        case,
        t,
        want,
        "idempotent",
        "after a new attempt recovered and committed checkpoint 1 again",
        exact=True,
    )
    _recommit_outcomes(b, 0, "a new attempt's commit of checkpoint 1")
    b.close()


def _crash_in_commit(a: SinkAttempt, cp: SinkCheckpoint) -> None:
    """Checkpoint ``cp`` completed; its commit crashes in the middle (the sink's own "commit" fault point
    if it calls it, else after subtask 0 committed and before the others did)."""
    cp.staged = set(a.target.staged())
    a.crash_in_commit = True
    if a.sink.global_commit:
        a.commit_global(cp.checkpoint_id, cp.global_committables)
    else:
        a.commit_upto(cp.checkpoint_id, [0])
    raise Crash("crash after part of the commit")


def _finish(case: SinkCase, t: SinkTarget, a: SinkAttempt, next_id: int, rounds: range, what: str) -> None:
    """Write the remaining rounds through ``a`` (one checkpoint each, the last one final), then check that
    every round is visible once and nothing is left staged."""
    for k, r in enumerate(rounds):
        a.cycle(next_id + k, case.data(r), last=r == case.rounds)
    if not rounds:
        a.cycle(next_id, {}, last=True)  # the final checkpoint: writers release what they held back
    a.close()
    _expect(
        case,
        t,
        case.expected(range(1, case.rounds + 1)),
        "recover",
        f"{what}, at the end of the job",
        exact=True,
    )
    left = sorted(t.staged())
    if left:
        raise violation(
            "abort",
            f"{what}: after the final checkpoint committed, the sink still holds staged data {left[:5]}: "
            "recover() must abort what the crashed attempts staged for checkpoints that never completed.",
        )


def _check_recovered(
    case: SinkCase, t: SinkTarget, a: SinkAttempt, restored: SinkCheckpoint, what: str
) -> None:
    stray = sorted(a.recovered_staged - restored.staged)
    if stray:
        raise violation(
            "abort",
            f"{what}: after recovery the sink still holds staged data that checkpoint "
            f"{restored.checkpoint_id} (the restored one) does not name: {stray[:5]}. recover(job_id, "
            "committables) (or the global committer, when it is created) must abort everything of the job that "
            "the committables do not name.",
        )
    rounds = range(1, restored.checkpoint_id + 1)
    _expect(
        case,
        t,
        case.expected(rounds),
        "recover",
        f"{what}, once checkpoint {restored.checkpoint_id} was committed again",
    )


@_contract("recover")
def check_recover_after_crash(case: SinkCase, step: str) -> None:
    """A crash at ``step`` of checkpoint 2 (one of :data:`RECOVERY_STEPS`), then a restore of the latest
    completed checkpoint and the rest of the input: every record visible exactly once, nothing staged left."""
    if step not in RECOVERY_STEPS:
        raise ConfigError(f"check_recover_after_crash: step must be one of {RECOVERY_STEPS} (got {step!r})")
    t = case.target()
    job = f"conformance-crash-{step.replace('_', '-')}"
    a = SinkAttempt(t, case.parallelism, job, 1)
    restored = a.cycle(1, case.data(1))
    try:
        for i, batches in case.data(2).items():
            for b in batches:
                a.write(i, b)
        if step == "write":
            raise Crash(step)
        a.prepare(2)
        if step == "prepare":
            raise Crash(step)
        cp2 = a.snapshot(2)
        if step == "snapshot":
            raise Crash(step)
        restored = cp2  # checkpoint 2 completed: its metadata is written before any commit
        if step == "commit":
            _crash_in_commit(a, cp2)
        a.complete(cp2)
        raise Crash(step)
    except Crash:
        pass
    what = f"crash at {step} of checkpoint 2"
    b = SinkAttempt(t, case.parallelism, job, 2, restored=restored)
    _check_recovered(case, t, b, restored, what)
    _finish(case, t, b, 3, range(restored.checkpoint_id + 1, case.rounds + 1), what)


@_contract("abort")
def check_abort_uncommitted(case: SinkCase) -> None:
    """Two attempts crash after staging data for a checkpoint that never completes; the third recovers:
    none of that data ever becomes visible and none of it stays staged."""
    t = case.target()
    job = "conformance-abort"
    a = SinkAttempt(t, case.parallelism, job, 1)
    restored = a.cycle(1, case.data(1))
    next_id = 2
    for attempt in (1, 2):
        if attempt == 2:
            a = SinkAttempt(t, case.parallelism, job, 2, restored=restored)
            _check_recovered(case, t, a, restored, "after a crash with checkpoint 2 staged")
        for i, batches in case.data(2).items():
            for b in batches:
                a.write(i, b)
        a.prepare(next_id)
        a.snapshot(next_id)
        next_id += 1  # this checkpoint never completes: the attempt crashes
    what = "two attempts crashed with data staged for checkpoints that never completed"
    c = SinkAttempt(t, case.parallelism, job, 3, restored=restored)
    _check_recovered(case, t, c, restored, what)
    _finish(case, t, c, next_id, range(2, case.rounds + 1), what)


@_contract("global_once")
def check_one_global_commit_per_checkpoint(case: SinkCase) -> bool:
    """A sink with a global committer commits each completed checkpoint once: the committables of a
    failed checkpoint go with the next one in one commit, and committing a checkpoint again (as after a
    restore) publishes nothing and reports ALREADY_COMMITTED. Returns False (checks nothing) for a sink
    without a global committer."""
    t = case.target()
    if not t.sink.global_commit:
        return False
    count = t.commits or (lambda: -1)
    a = SinkAttempt(t, case.parallelism, "conformance-global", 1)
    c0 = count()

    def commits(n: int, when: str) -> None:
        if t.commits is not None and count() != c0 + n:
            raise violation(
                "global_once",
                f"{when}: the target has {count() - c0} commit(s) since the job started, expected {n}: one "
                "atomic commit per completed checkpoint",
            )

    a.cycle(1, case.data(1))
    commits(1, "after checkpoint 1")
    for i, batches in case.data(2).items():
        for b in batches:
            a.write(i, b)
    a.prepare(2)
    a.snapshot(2)  # checkpoint 2 fails: its committables go with checkpoint 3
    cp3 = a.cycle(3, case.data(3))
    commits(2, "after checkpoint 2 failed and checkpoint 3 completed")
    want = case.expected([1, 2, 3])
    _expect(
        case, t, want, "global_once", "after checkpoint 3 (which carried checkpoint 2's data)", exact=True
    )
    start = len(a.outcomes)
    a.commit_global(3, cp3.global_committables)
    _expect(
        case, t, want, "global_once", "after the global committer committed checkpoint 3 again", exact=True
    )
    commits(2, "after the global committer committed checkpoint 3 again")
    _recommit_outcomes(a, start, "the global committer, committing checkpoint 3 again,")
    b = SinkAttempt(t, case.parallelism, "conformance-global", 2, restored=cp3)
    _expect(
        case,
        t,
        want,
        "global_once",
        "after a new attempt's global committer committed checkpoint 3 again",
        exact=True,
    )
    commits(2, "after a new attempt committed checkpoint 3 again")
    _recommit_outcomes(b, 0, "a new attempt's global committer, committing checkpoint 3 again,")
    _finish(case, t, b, 4, range(4, case.rounds + 1), "global commits")
    return True
