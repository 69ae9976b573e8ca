"""Changelog checkpoints on both backends: a checkpoint persists only the changes since the last one, a
materialization is written in the background, restore = materialization + changes (also at another
parallelism), and old segments and materializations are deleted exactly when no retained checkpoint
references them."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest
from sluice.state.api import ListStateDescriptor, ValueStateDescriptor
from sluice.state.config import StateTtlConfig
from sluice.state.handles import persisted_bytes, total_bytes
from sluice.state.spi import Handle, KeyedStateBackend
from sluice.state.transfer import LocalFileTransfer

from tests.state.conftest import BACKENDS, Clock, MakeBackend
from tests.state.harness import Coordinator, Model, dump, random_op
from tests.state.test_backends import at

COUNT = ValueStateDescriptor("count", serializer="int64")


def put_counts(be: KeyedStateBackend, keys: range, value: int) -> None:
    be.batch_state(COUNT).put(be.key_batch([pa.array(keys, pa.int64())]), pa.array([value] * len(keys), pa.int64()))


def get_counts(be: KeyedStateBackend, keys: range) -> list[Any]:
    return be.batch_state(COUNT).get(be.key_batch([pa.array(keys, pa.int64())])).to_pylist()


def checkpoint(be: KeyedStateBackend, cid: int) -> Handle:
    handle = be.snapshot(cid).run()
    be.notify_checkpoint_complete(cid)
    return handle


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_checkpoint_after_changing_1_percent_of_the_keys_persists_about_1_percent(
    kind: str, make_backend: MakeBackend, storage: LocalFileTransfer
) -> None:
    be: Any = make_backend(kind, changelog=True, changelog_materialize_interval="1 h")
    put_counts(be, range(20_000), 1)
    be.materialize().result()
    first = checkpoint(be, 1)
    full = total_bytes(first)
    assert first["base"] is not None and not first["base"]["confirmed"]  # it lists the materialization as new
    put_counts(be, range(0, 20_000, 100), 2)  # 1% of the keys change
    listed = set(storage.list(""))
    snap = be.snapshot(2)
    assert set(storage.list("")) == listed  # the synchronous part only seals: nothing is written
    put_counts(be, range(20_000), 3)  # after the seal: not part of checkpoint 2
    second = snap.run()
    assert second["base"]["confirmed"] and [s["placeholder"] for s in second["segments"]] == [False]
    assert 0.001 * full < persisted_bytes(second) <= 0.03 * full
    restored = make_backend(kind)
    restored.restore([second])
    assert get_counts(restored, range(0, 300, 50)) == [2, 1, 2, 1, 2, 1]
    plain = make_backend(kind)  # changelog off: a full checkpoint each time
    put_counts(plain, range(20_000), 1)
    checkpoint(plain, 1)
    put_counts(plain, range(0, 20_000, 100), 2)
    assert persisted_bytes(checkpoint(plain, 2)) > 0.5 * full


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("changelog", [False, True], ids=["plain", "changelog"])
def test_restore_equals_the_live_state_under_random_operations(
    kind: str, changelog: bool, make_backend: MakeBackend, storage: LocalFileTransfer, clock: Clock
) -> None:
    """Random changes, checkpoints (completed, aborted, declined, notified late or never), materializations
    in between and failovers to a restored backend; every restore equals the model at its checkpoint, and
    the coordinator never deletes a file a retained checkpoint needs."""
    rng = random.Random(f"{kind}-{changelog}")
    options: dict[str, Any] = {"changelog": changelog, "changelog_materialize_interval": "10 s", "incremental": True}
    be: Any = make_backend(kind, **options)
    coordinator = Coordinator(storage)
    model, cid = Model(), 0
    pending: list[tuple[int, Any, Model]] = []
    completed: dict[int, tuple[Handle, Model]] = {}
    restores = 0
    for _ in range(700):
        r = rng.random()
        if r < 0.8:
            random_op(be, model, rng)
        elif r < 0.87:
            cid += 1
            pending.append((cid, be.snapshot(cid), model.copy()))
        elif r < 0.93 and pending:
            done, snap, at_checkpoint = pending.pop(0)
            handle = snap.run()
            if rng.random() < 0.85 and coordinator.complete(done, [handle]):
                completed[done] = (handle, at_checkpoint)
                if rng.random() < 0.9:  # sometimes the notification is lost
                    be.notify_checkpoint_complete(done)
            else:
                coordinator.abort([handle])
                be.notify_checkpoint_aborted(done)
        elif r < 0.96:
            clock.advance(rng.randrange(1_000, 15_000))
            if changelog and rng.random() < 0.3:
                be.materialize()
        elif completed:
            # a failover to a retained checkpoint (a restarted task), or a check of the oldest retained one
            retained = [c for c, _ in coordinator.retained]
            chosen = rng.choice(retained)
            handle, at_checkpoint = completed[chosen]
            fresh: Any = make_backend(kind, **options)
            fresh.restore([handle])
            assert dump(fresh) == at_checkpoint
            restores += 1
            if chosen == retained[-1] and rng.random() < 0.5:
                be, model = fresh, at_checkpoint.copy()
                for _, snap, _ in pending:
                    snap.discard()
                pending.clear()
    assert restores >= 5 and len(completed) >= 10
    assert coordinator.referenced() <= set(storage.list(""))


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize(("old", "new"), [(1, 2), (2, 1), (2, 3), (3, 2)])
def test_rescale_through_changelog(kind: str, old: int, new: int, make_backend: MakeBackend) -> None:
    """Each old subtask checkpoints a materialization plus segments; the new subtasks restore their key
    groups out of all of them."""
    rng = random.Random(f"{kind}-{old}-{new}")
    handles, model = [], Model()
    for i in range(old):
        be: Any = make_backend(kind, parallelism=old, index=i, changelog=True)
        mine = Model()
        for step in range(300):
            random_op(be, mine, rng)
            if step == 150:
                be.materialize().result()
                checkpoint(be, 1)
        handles.append(checkpoint(be, 2))
        assert handles[-1]["base"] is not None and handles[-1]["segments"]
        model = model.merge(mine)
    for i in range(new):
        restored = make_backend(kind, parallelism=new, index=i, changelog=True)
        restored.restore(handles)
        assert dump(restored) == model.owned(restored)
        plain = make_backend(kind, parallelism=new, index=i)  # changelog switched off: the same state
        plain.restore(handles)
        assert dump(plain) == model.owned(plain)


@pytest.mark.parametrize("kind", BACKENDS)
def test_old_segments_and_materializations_are_deleted_exactly_when_no_retained_checkpoint_uses_them(
    kind: str, make_backend: MakeBackend, storage: LocalFileTransfer
) -> None:
    rng = random.Random(kind)
    be: Any = make_backend(kind, changelog=True, changelog_materialize_interval="1 h")
    coordinator = Coordinator(storage, retained=2)
    model, models = Model(), {}
    for cid in range(1, 16):
        for _ in range(40):
            random_op(be, model, rng)
        if cid % 4 == 0:
            be.materialize().result()
        handle = be.snapshot(cid).run()
        assert coordinator.complete(cid, [handle])
        be.notify_checkpoint_complete(cid)
        models[cid] = model.copy()
        # exactly the files a retained checkpoint references are in storage: nothing leaks, nothing needed is gone
        assert set(storage.list("shared")) == coordinator.referenced()
        for retained, handles in coordinator.retained:
            fresh = make_backend(kind)  # changelog off: it uploads nothing of its own
            fresh.restore(handles)
            assert dump(fresh) == models[retained]
    segments = [p for p in coordinator.deleted if p.endswith(".arrows") and "-s" in p.rsplit("/", 1)[-1]]
    materialized = [p for p in coordinator.deleted if "-m" in p.rsplit("/", 1)[-1]]
    assert segments and materialized  # both kinds were deleted once subsumed
    assert coordinator.declined == 0


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_materialization_is_dropped_with_the_checkpoint_that_introduced_it(
    kind: str, make_backend: MakeBackend, storage: LocalFileTransfer
) -> None:
    be: Any = make_backend(kind, changelog=True, changelog_materialize_interval="1 h")
    coordinator = Coordinator(storage)
    put_counts(be, range(500), 1)
    assert coordinator.complete(1, [checkpoint(be, 1)])
    put_counts(be, range(100), 2)
    be.materialize().result()
    introduced = be.snapshot(2).run()
    put_counts(be, range(50), 3)
    optimistic = be.snapshot(3).run()  # before checkpoint 2 is decided: the materialization as a placeholder
    assert introduced["base"]["id"] == optimistic["base"]["id"] and optimistic["base"]["confirmed"]
    coordinator.abort([introduced])  # deletes the materialization's files
    be.notify_checkpoint_aborted(2)
    assert not coordinator.complete(3, [optimistic])  # the registry declines what relies on them
    be.notify_checkpoint_aborted(3)
    after = be.snapshot(4).run()  # back on the confirmed base, with every change since it
    assert after["base"] is None or after["base"]["id"] != introduced["base"]["id"]
    assert coordinator.complete(4, [after])
    be.notify_checkpoint_complete(4)
    restored = make_backend(kind)
    restored.restore([after])
    assert get_counts(restored, range(45, 55)) == [3] * 5 + [2] * 5 and get_counts(restored, range(499, 501)) == [1, None]
    assert be.materialize() is not None  # a new materialization replaces the dropped one


@pytest.mark.parametrize("kind", BACKENDS)
def test_materializations_start_on_their_interval(kind: str, make_backend: MakeBackend, clock: Clock) -> None:
    be: Any = make_backend(kind, changelog=True, changelog_materialize_interval="10 s")
    put_counts(be, range(100), 1)
    clock.advance(9_000)
    assert checkpoint(be, 1)["base"] is None  # not due yet: the changes since the (empty) start
    clock.advance(1_000)
    be.materialize_if_due()
    be.materialize().result()  # the one that is under way
    second = checkpoint(be, 2)
    assert second["base"] is not None and second["segments"] == []  # nothing changed after it started
    clock.advance(60_000)
    be.materialize_if_due()  # nothing changed since: no new materialization
    assert be.materialize() is None
    assert checkpoint(be, 3)["base"]["id"] == second["base"]["id"]


@pytest.mark.parametrize("kind", BACKENDS)
def test_ttl_and_its_cleanup_go_through_the_changelog(kind: str, make_backend: MakeBackend, clock: Clock) -> None:
    ttl = StateTtlConfig(ttl="10 s", cleanup_in_background=False)
    value = ValueStateDescriptor("v", serializer="int64", ttl=ttl)
    items = ListStateDescriptor("l", serializer="string", ttl=ttl)
    be: Any = make_backend(kind, changelog=True, changelog_materialize_interval="1 h")
    start = clock.now
    for k in ("a", "b"):
        at(be, k).state(value).update(1)
        be.state(items).add("old")
    be.materialize().result()
    checkpoint(be, 1)
    clock.advance(6_000)
    at(be, "b").state(value).update(2)  # restarts b's clock
    be.state(items).add("new")
    at(be, "c").state(value).update(3)
    clock.advance(6_000)  # a and the "old" elements expired
    assert be.cleanup_expired(100) >= 3
    handle = checkpoint(be, 2)
    clock.now = start + 1_000  # the removals are in the changelog, not only hidden by the clock
    restored = make_backend(kind)
    restored.restore([handle])
    got = {k: (at(restored, k).state(value).value(), restored.state(items).get()) for k in ("a", "b", "c")}
    assert got == {"a": (None, []), "b": (2, ["new"]), "c": (3, [])}
    clock.now = start + 17_000  # b's value and "new" expire at 16 s, c's at 16 s
    assert at(restored, "b").state(value).value() is None and restored.state(items).get() == []


@pytest.mark.parametrize("kind", BACKENDS)
def test_switching_changelog_on_and_off_through_a_checkpoint(kind: str, make_backend: MakeBackend) -> None:
    rng = random.Random(kind)
    plain: Any = make_backend(kind, incremental=True)
    model = Model()
    for _ in range(200):
        random_op(plain, model, rng)
    on: Any = make_backend(kind, changelog=True)
    on.restore([checkpoint(plain, 1)])
    assert dump(on) == model
    for _ in range(200):
        random_op(on, model, rng)
    off: Any = make_backend(kind)
    off.restore([checkpoint(on, 2)])  # waits for the materialization of the restored state
    assert dump(off) == model


def test_a_changelog_checkpoint_of_one_backend_is_refused_by_the_other(make_backend: MakeBackend) -> None:
    from sluice.errors import RestoreError

    be: Any = make_backend("rocksdb", changelog=True)
    put_counts(be, range(10), 1)
    handle = checkpoint(be, 1)
    with pytest.raises(RestoreError, match="switch backends through a savepoint") as info:
        make_backend("hashmap", changelog=True).restore([handle])
    assert "\n" not in str(info.value)
    savepoint = be.snapshot(2, savepoint=True).run()  # a savepoint is canonical, as without changelog
    other = make_backend("hashmap", changelog=True)
    other.restore([savepoint])
    assert get_counts(other, range(9, 11)) == [1, None]
