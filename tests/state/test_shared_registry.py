"""The shared-state registry: a shared file is deleted exactly when the last retained checkpoint that uses
it is subsumed, never earlier; unconfirmed uploads are never reused (FLINK-25395)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from sluice.errors import CheckpointError, CheckpointFailureReason
from sluice.state.shared_registry import SharedRef, SharedStateRegistry, shared_refs


def test_a_file_lives_while_a_retained_checkpoint_uses_it() -> None:
    reg = SharedStateRegistry()
    reg.register_checkpoint(1, [SharedRef("a"), SharedRef("b")])
    reg.register_checkpoint(2, [SharedRef("a", placeholder=True), SharedRef("c")])
    assert reg.unregister_unused(2) == ["b"]  # checkpoint 1 subsumed: only it used b
    reg.register_checkpoint(3, [SharedRef("c", placeholder=True), SharedRef("d")])
    assert reg.unregister_unused(3) == ["a"]
    assert reg.referenced() == {"c", "d"} and reg.last_used("c") == 3


def test_a_placeholder_of_an_unknown_file_declines_the_checkpoint() -> None:
    reg = SharedStateRegistry()
    reg.register_checkpoint(1, [SharedRef("a")])
    reg.validate(2, [SharedRef("a", True), SharedRef("new")])
    with pytest.raises(CheckpointError, match="gone"):
        reg.validate(2, [SharedRef("gone", True)])
    with pytest.raises(CheckpointError) as info:
        reg.register_checkpoint(2, [SharedRef("a", True), SharedRef("gone", True), SharedRef("new")])
    assert info.value.reason is CheckpointFailureReason.DECLINED and "gone" in str(info.value)
    assert reg.referenced() == {"a"} and reg.last_used("a") == 1  # nothing was recorded
    assert reg.discard_unregistered([SharedRef("a", True), SharedRef("new"), SharedRef("a")]) == ["new"]


def test_rebuild_accepts_placeholders_whose_first_user_is_gone_and_finds_orphans() -> None:
    reg = SharedStateRegistry.rebuild([(5, [SharedRef("x", True), SharedRef("y")]), (4, [SharedRef("x", True)])])
    assert reg.last_used("x") == 5 and reg.last_used("y") == 5
    assert reg.orphans(["x", "y", "z", "w"]) == ["w", "z"]


def test_shared_refs_read_native_handles_only() -> None:
    native = {"format": "native", "shared": {"1.sst": {"path": "shared/o/1", "placeholder": True}, "2.sst": {"path": "shared/o/2"}}}
    canonical = {"format": "canonical", "groups": {}}
    assert shared_refs([native, canonical, None]) == [SharedRef("shared/o/1", True), SharedRef("shared/o/2", False)]


@dataclass
class _Job:
    """A coordinator with ``retain`` retained checkpoints and one incremental backend, as a model."""

    retain: int
    rng: random.Random
    registry: SharedStateRegistry = field(default_factory=SharedStateRegistry)
    retained: list[tuple[int, list[SharedRef]]] = field(default_factory=list)
    pending: dict[int, list[SharedRef]] = field(default_factory=dict)
    confirmed: list[str] = field(default_factory=list)  # the backend's view: files of the last completion it heard of
    notices: list[int] = field(default_factory=list)  # completions not yet delivered to the backend
    existing: set[str] = field(default_factory=set)
    deleted: set[str] = field(default_factory=set)
    next_id: int = 1
    next_file: int = 0
    declined: int = 0

    def delete(self, paths: list[str]) -> None:
        for p in paths:
            assert p not in self.deleted, f"{p} deleted twice"
            assert p in self.existing, f"{p} deleted but never uploaded"
            in_use = {r.path for _, refs in self.retained for r in refs}
            assert p not in in_use, f"{p} deleted while a retained checkpoint uses it"
            self.existing.discard(p)
            self.deleted.add(p)

    def trigger(self) -> None:
        reused = [SharedRef(p, True) for p in self.confirmed if self.rng.random() < 0.7]
        new = []
        for _ in range(self.rng.randint(0, 3)):
            path = f"shared/{self.next_file}"
            self.next_file += 1
            self.existing.add(path)
            new.append(SharedRef(path))
        self.pending[self.next_id] = reused + new
        self.next_id += 1

    def abort(self, cid: int) -> None:
        self.delete(self.registry.discard_unregistered(self.pending.pop(cid)))

    def complete(self, cid: int) -> None:
        refs = self.pending.pop(cid)
        for older in [c for c in self.pending if c < cid]:  # subsumed while pending
            self.abort(older)
        try:
            self.registry.register_checkpoint(cid, refs)
        except CheckpointError:
            self.declined += 1
            self.delete(self.registry.discard_unregistered(refs))
            return
        self.retained.append((cid, refs))
        while len(self.retained) > self.retain:
            self.retained.pop(0)
        self.delete(self.registry.unregister_unused(self.retained[0][0]))
        self.notices.append(cid)

    def deliver(self) -> None:
        cid = self.notices.pop(0)
        refs = next((r for c, r in self.retained if c == cid), None)
        if refs is not None:
            self.confirmed = [r.path for r in refs]

    def crash_and_restore(self) -> None:
        self.pending.clear()  # the uploads of pending checkpoints are left behind
        self.notices.clear()
        self.registry = SharedStateRegistry.rebuild(self.retained)
        self.delete(self.registry.orphans(self.existing))
        self.confirmed = [r.path for r in self.retained[-1][1]] if self.retained else []

    def check(self) -> None:
        in_use = {r.path for _, refs in self.retained for r in refs}
        owned_by_pending = {r.path for refs in self.pending.values() for r in refs if not r.placeholder}
        assert in_use <= self.existing, "a retained checkpoint references a deleted file"
        assert self.existing <= in_use | owned_by_pending, "a file no checkpoint can use was left behind"


@pytest.mark.parametrize("seed", range(40))
def test_random_completions_aborts_subsumptions_and_restores(seed: int) -> None:
    rng = random.Random(seed)
    job = _Job(retain=rng.randint(1, 3), rng=rng)
    for _ in range(300):
        op = rng.random()
        if op < 0.35 or not job.pending:
            job.trigger()
        elif op < 0.65:
            job.complete(rng.choice(sorted(job.pending)))
        elif op < 0.75:
            job.abort(rng.choice(sorted(job.pending)))
        elif op < 0.95 and job.notices:
            job.deliver()
        elif op >= 0.97:
            job.crash_and_restore()
        job.check()
    for cid in sorted(job.pending):
        job.abort(cid)
    job.check()
    assert job.deleted  # files did go
    DECLINED.append(job.declined)


DECLINED: list[int] = []


def test_the_random_runs_met_stale_confirmations() -> None:
    """Some runs reused files whose last checkpoint was subsumed before the backend heard of a newer one:
    the registry declined those checkpoints instead of completing them over deleted files."""
    if not DECLINED:
        for seed in range(10):
            test_random_completions_aborts_subsumptions_and_restores(seed)
    assert sum(DECLINED) > 0
