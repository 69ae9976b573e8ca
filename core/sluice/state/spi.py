"""The state backend SPI: a :class:`StateBackend` per job makes a :class:`KeyedStateBackend` per operator
subtask, over the key groups the subtask owns.

A keyed backend holds keyed value, list and map state and timers, always partitioned by key group (the unit
of rescaling). Operators reach state per key (:meth:`KeyedStateBackend.set_current_key`, then the handles
of :meth:`~KeyedStateBackend.state`) or a whole Arrow batch of keys at once
(:meth:`~KeyedStateBackend.batch_state`). A checkpoint is a synchronous :meth:`~KeyedStateBackend.snapshot`
(cheap: freeze or hard-link) and an asynchronous :meth:`StateSnapshot.run` that writes or uploads and
returns the *handle*: plain data (numbers, strings, bytes, lists, dicts) that travels inside the signed
task state file. :meth:`~KeyedStateBackend.restore` takes the handles of every old subtask whose key groups
overlap this one's.
"""

from __future__ import annotations

import enum
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pyarrow as pa

from sluice.errors import ConfigError
from sluice.state.keycodec import encode_key, encode_keys, encode_keys_fixed, rows_as_bytes
from sluice.state.keygroups import KeyGroupRange, hash_columns, key_groups
from sluice.state.transfer import FileTransfer

if TYPE_CHECKING:
    from sluice.state.config import StateBackendConfig
    from sluice.state.meta import StateMeta

__all__ = [
    "BatchValueState",
    "KeyBatch",
    "KeyedStateBackend",
    "StateBackend",
    "StatePaths",
    "StateSnapshot",
    "TimeDomain",
    "Timer",
    "TimerService",
]

#: a handle: plain data describing one subtask's keyed state in a checkpoint or savepoint
Handle = dict[str, Any]


class TimeDomain(enum.IntEnum):
    """Which clock a timer follows."""

    EVENT = 0
    PROCESSING = 1


@dataclass(frozen=True, order=True)
class Timer:
    """A registered timer: when, and for which key (encoded) and namespace."""

    timestamp: int
    key_group: int
    key: bytes
    namespace: bytes = b""


class TimerService(ABC):
    """Event- and processing-time timers of one keyed backend, per key group, deduplicated by
    (timestamp, key, namespace)."""

    @abstractmethod
    def register(self, domain: TimeDomain, timestamp: int, key_group: int, key: bytes, namespace: bytes = b"") -> None:
        """Register a timer (again registering the same one is a no-op)."""

    @abstractmethod
    def delete(self, domain: TimeDomain, timestamp: int, key_group: int, key: bytes, namespace: bytes = b"") -> None:
        """Delete a timer, if registered."""

    @abstractmethod
    def pop_due(self, domain: TimeDomain, upto: int) -> list[Timer]:
        """Remove and return every timer at or before ``upto``, in (timestamp, key group, key) order."""

    @abstractmethod
    def next_timestamp(self, domain: TimeDomain) -> int | None:
        """The earliest timer's timestamp, or None."""

    @abstractmethod
    def timers(self, domain: TimeDomain) -> Iterator[Timer]:
        """Every registered timer (any order)."""


class KeyBatch:
    """The keys of an Arrow batch, encoded, with their key groups: what batch-wise access takes.

    Attributes:
        keys: each row's key as stable bytes (:mod:`sluice.state.keycodec`).
        key_groups: each row's key group (int64 NumPy array).
        fixed: the same encoded keys as an ``(n, width)`` uint8 matrix when they all have one width (int,
            float, bool or date key columns without nulls), else None: backends build storage keys from it
            with NumPy.
        hashes: each row's 64-bit key hash (uint64, the one its key group comes from) when known, else None.
    """

    __slots__ = ("_keys", "fixed", "hashes", "key_groups")

    def __init__(
        self,
        keys: list[bytes] | None,
        key_groups: np.ndarray,
        fixed: np.ndarray | None = None,
        hashes: np.ndarray | None = None,
    ) -> None:
        if keys is None and fixed is None:
            raise ValueError("KeyBatch needs the encoded keys or their fixed-width matrix")
        self._keys = keys
        self.key_groups = key_groups
        self.fixed = fixed
        self.hashes = hashes

    @property
    def keys(self) -> list[bytes]:
        """Each row's key as stable bytes (made from :attr:`fixed` on first use)."""
        if self._keys is None:
            assert self.fixed is not None
            self._keys = rows_as_bytes(self.fixed)
        return self._keys

    @classmethod
    def of(cls, columns: Sequence[pa.Array | pa.ChunkedArray], max_parallelism: int) -> KeyBatch:
        """The keys of one or more key columns (the same encoding and key groups as per-key access)."""
        arrays = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in columns]
        hashes = hash_columns(arrays)
        groups = key_groups(hashes, max_parallelism)
        fixed = encode_keys_fixed(arrays)
        if fixed is not None:
            return cls(None, groups, fixed, hashes)
        return cls(encode_keys(arrays), groups, hashes=hashes)

    def __len__(self) -> int:
        return len(self.key_groups)


class BatchValueState(ABC):
    """A value state read and written for a whole batch of keys at once (multi-get, write batches)."""

    @abstractmethod
    def get(self, keys: KeyBatch) -> pa.Array:
        """Each key's value (null where none), as an Arrow array of the serializer's type."""

    @abstractmethod
    def put(self, keys: KeyBatch, values: pa.Array) -> None:
        """Set each key's value; a null value clears it. A key repeated in the batch keeps its last value."""

    @abstractmethod
    def delete(self, keys: KeyBatch) -> None:
        """Clear each key's value."""

    def insert(self, keys: KeyBatch, values: pa.Array) -> None:
        """As :meth:`put`, for keys that are seldom read back soon (e.g. a key's first record, most often
        never seen again): a backend may write them past its cache. By default, :meth:`put`."""
        self.put(keys, values)


class StateSnapshot(ABC):
    """The result of a snapshot's synchronous part; :meth:`run` is its asynchronous part."""

    @abstractmethod
    def run(self) -> Handle:
        """Write or upload the frozen state and return its handle (plain data)."""

    def discard(self) -> None:  # noqa: B027 - optional hook
        """Release local resources when :meth:`run` will not be called (the checkpoint was aborted)."""


@dataclass(frozen=True)
class StatePaths:
    """Where a keyed backend's files go, relative to the job's checkpoint folder (the transfer's root).

    Attributes:
        owner: the subtask's unique name (e.g. ``"<operator>-<subtask>"``).
    """

    owner: str

    def shared(self, name: str) -> str:
        """A file that several checkpoints may reference (an SST file of an incremental checkpoint)."""
        return f"shared/{self.owner}/{name}"

    def private(self, checkpoint_id: int, name: str, savepoint: bool = False) -> str:
        """A file of one checkpoint (or savepoint) only, in its folder (``chk-<n>``, ``savepoint-<n>``):
        deleted with it, and a savepoint's folder holds all of its files."""
        return f"{'savepoint' if savepoint else 'chk'}-{checkpoint_id}/{self.owner}/{name}"


class KeyedStateBackend(ABC):
    """Keyed state and timers of one operator subtask, for the key groups it owns.

    Attributes:
        key_groups: the key groups this subtask owns.
        max_parallelism: the job's number of key groups.
    """

    #: a built-in backend's name in its handles (``"hashmap"``, ``"rocksdb"``); empty for the others
    backend_name: ClassVar[str] = ""

    def __init__(
        self,
        key_groups: KeyGroupRange,
        max_parallelism: int,
        transfer: FileTransfer,
        paths: StatePaths,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.key_groups = key_groups
        self.max_parallelism = max_parallelism
        self.transfer = transfer
        self.paths = paths
        #: processing time in ms, for state TTL
        self.clock: Callable[[], int] = clock or (lambda: int(time.time() * 1000))
        self._key: Any = None
        self._key_bytes = b""
        self._kg = -1
        self._namespace = b""

    # -- current key ----------------------------------------------------------------------------------
    def set_current_key(self, key: Any, key_group: int, key_bytes: bytes | None = None) -> None:
        """Make ``key`` (of ``key_group``) the key the per-key handles read and write."""
        self._key = key
        self._kg = key_group
        self._key_bytes = encode_key(key) if key_bytes is None else key_bytes

    def set_current_namespace(self, namespace: bytes) -> None:
        """Scope the per-key handles to ``namespace`` (e.g. a window); ``b""`` by default."""
        self._namespace = namespace

    @property
    def current_key(self) -> Any:
        """The current key's value."""
        return self._key

    @property
    def current_key_bytes(self) -> bytes:
        """The current key, encoded."""
        return self._key_bytes

    @property
    def current_key_group(self) -> int:
        """The current key's key group."""
        return self._kg

    def key_batch(self, columns: Sequence[pa.Array | pa.ChunkedArray]) -> KeyBatch:
        """The keys of key columns, checked to belong to this subtask's key groups."""
        batch = KeyBatch.of(columns, self.max_parallelism)
        kgs = batch.key_groups
        if len(kgs) and (kgs.min() < self.key_groups.start or kgs.max() >= self.key_groups.end):
            raise ConfigError(
                f"batch-wise state access: keys of key groups outside {self.key_groups} reached this subtask "
                "(key the stream with the same columns before the stateful operator)"
            )
        return batch

    # -- state ----------------------------------------------------------------------------------------
    @abstractmethod
    def state(self, descriptor: Any) -> Any:
        """The per-key handle (value, list or map state) for ``descriptor``, bound to the current key."""

    @abstractmethod
    def batch_state(self, descriptor: Any) -> BatchValueState:
        """Batch-wise access to the value state ``descriptor`` (its serializer needs an Arrow type)."""

    @abstractmethod
    def keys(self, name: str) -> Iterator[tuple[int, Any]]:
        """Every (key group, key) with a value in state ``name`` (default namespace)."""

    def encoded_keys(self, name: str) -> Iterator[tuple[int, pa.Array]]:
        """Per key group, the keys :meth:`keys` gives, encoded as state stores them
        (:mod:`sluice.state.keycodec`), as one binary array: the built-in backends hand the stored bytes over
        in bulk, decoding nothing (a filter of the keys rebuilt at restore reads them so); by default the
        keys of :meth:`keys`, encoded again."""
        groups: dict[int, list[bytes]] = {}
        for kg, key in self.keys(name):
            groups.setdefault(kg, []).append(encode_key(key))
        for kg, keys in groups.items():
            yield kg, pa.array(keys, pa.binary())

    @property
    @abstractmethod
    def timers(self) -> TimerService:
        """This backend's timers."""

    @abstractmethod
    def cleanup_expired(self, max_entries: int) -> int:
        """Check up to ``max_entries`` entries of states with a TTL, removing expired ones; the number
        removed."""

    def drop_state(self, name: str) -> None:
        """Remove every entry of state ``name`` (every key group of this subtask) at once, without visiting
        entries where the backend can (RocksDB: a range deletion per key group; hashmap: its tables), and
        forget the state (it leaves :meth:`state_meta`; handles of it must not be used again). Operators
        that keep state in time buckets drop a bucket whole this way.

        Raises:
            NotImplementedError: the backend cannot drop a state.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot drop a state")

    @abstractmethod
    def state_meta(self) -> dict[str, StateMeta]:
        """Every state this backend holds (registered or restored), as checkpoints describe it."""

    def materialize_if_due(self) -> None:  # noqa: B027 - optional hook
        """Periodic work on the task's thread, between batches: with changelog checkpoints, start a
        background materialization once its interval has passed. A no-op otherwise."""

    def materialize(self) -> Future[Any] | None:
        """With changelog checkpoints: start a materialization now (unless one is under way or nothing
        changed) and return it to wait for. None otherwise."""
        return None

    # -- checkpoints ----------------------------------------------------------------------------------
    @abstractmethod
    def snapshot(self, checkpoint_id: int, savepoint: bool = False) -> StateSnapshot:
        """The synchronous part of a checkpoint (a savepoint: the canonical format)."""

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:  # noqa: B027 - optional hook
        """Checkpoint ``checkpoint_id`` completed (its files may be reused)."""

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:  # noqa: B027 - optional hook
        """Checkpoint ``checkpoint_id`` was aborted."""

    @abstractmethod
    def restore(self, handles: Sequence[Handle]) -> None:
        """Load the key groups this subtask owns out of the handles of old subtasks (other key groups
        are left out)."""

    def restore_metrics(self) -> dict[str, int]:
        """Counters of the last :meth:`restore` (local recovery: files taken from the local copy, read from
        checkpoint storage, local copies refused); the keyed operator adds them to the job's metrics."""
        return {}

    def dispose(self) -> None:  # noqa: B027 - optional hook
        """Release resources (files, database handles)."""


class StateBackend(ABC):
    """A job's state backend: makes a keyed backend per stateful operator subtask.

    Attributes:
        config: the options it was made from.
    """

    def __init__(self, config: StateBackendConfig) -> None:
        self.config = config

    @abstractmethod
    def create_keyed_backend(
        self,
        owner: str,
        key_groups: KeyGroupRange,
        max_parallelism: int,
        transfer: FileTransfer,
        clock: Callable[[], int] | None = None,
    ) -> KeyedStateBackend:
        """A keyed backend for the subtask named ``owner`` (unique in the job), over ``key_groups``."""
