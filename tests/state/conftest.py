"""Fixtures for the state backend tests: both backends, a local transfer folder, a settable clock."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sluice.state.config import StateBackendConfig
from sluice.state.factory import create_state_backend
from sluice.state.keygroups import KeyGroupRange, key_group_range
from sluice.state.spi import KeyedStateBackend, StateBackend
from sluice.state.transfer import LocalFileTransfer

BACKENDS = ["hashmap", "rocksdb"]


class Clock:
    """Processing time in ms that a test moves by hand."""

    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def storage(tmp_path: Path) -> LocalFileTransfer:
    return LocalFileTransfer(str(tmp_path / "storage"))


def state_backend(kind: str, tmp_path: Path, **options: object) -> StateBackend:
    settings: dict[str, object] = {"type": kind, "local_dir": str(tmp_path / "local"), "memory": "64 mb", **options}
    config = StateBackendConfig(**settings)
    backend: StateBackend = create_state_backend(config)
    return backend


MakeBackend = Callable[..., KeyedStateBackend]


@pytest.fixture
def make_backend(tmp_path: Path, storage: LocalFileTransfer, clock: Clock) -> Iterator[MakeBackend]:
    """``make(kind, parallelism=1, index=0, max_parallelism=16, **options)``: a keyed backend, disposed after
    the test."""
    made: list[KeyedStateBackend] = []

    def make(
        kind: str, parallelism: int = 1, index: int = 0, max_parallelism: int = 16, **options: object
    ) -> KeyedStateBackend:
        factory = state_backend(kind, tmp_path, **options)
        kgs: KeyGroupRange = key_group_range(max_parallelism, parallelism, index)
        be = factory.create_keyed_backend(f"op-{index}", kgs, max_parallelism, storage, clock)
        made.append(be)
        return be

    yield make
    for be in made:
        be.dispose()
