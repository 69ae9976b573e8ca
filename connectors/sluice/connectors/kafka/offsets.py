"""Starting and stopping offsets, split ids and the deterministic split assignment.

An :class:`OffsetsInitializer` says *where* to start (or stop) symbolically; the enumerator resolves it to
concrete offsets once, when it discovers a partition, so a checkpoint always holds a real offset (resolving
``latest`` again after a restore would skip the records produced in between).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

import pyarrow as pa
from sluice.errors import ConfigError
from sluice.source import SourceSplit

__all__ = [
    "KafkaSplit",
    "OffsetLookup",
    "OffsetsInitializer",
    "RunState",
    "TopicPartitionKey",
    "owner_of",
    "parse_split_id",
    "resolve_offsets",
    "split_id",
]

#: (topic, partition)
TopicPartitionKey = tuple[str, int]


@dataclass
class RunState:
    """What the enumerators of one run share across its failover attempts (the source keeps it).

    Attributes:
        stops: this run's stop offsets, resolved when the run starts (its failover attempts keep them).
        brokers_reached: an enumerator of this source reached the brokers (unreachable after that: an
            outage, which restarts may cure).
    """

    stops: dict[TopicPartitionKey, int] = field(default_factory=dict)
    brokers_reached: bool = False


@dataclass
class KafkaSplit(SourceSplit):
    """A partition split that also carries the stream's inferred value schema (json/csv without a schema).

    The enumerator infers the schema once from a sample across partitions and hands it to every reader
    with its splits; readers widen it and checkpoint it with their positions, so a restore starts from the
    same schema.
    """

    value_schema: pa.Schema | None = None


KINDS = ("earliest", "latest", "committed", "timestamp", "offsets")
FALLBACKS = ("earliest", "latest")


@dataclass(frozen=True)
class OffsetsInitializer:
    """Where reading starts (or, for bounded runs, stops) in each partition.

    Build one with the class methods; the strings ``"earliest"``, ``"latest"`` and ``"committed"`` and a
    ``{(topic, partition): offset}`` dict are accepted wherever an initializer is.
    """

    kind: Literal["earliest", "latest", "committed", "timestamp", "offsets"]
    timestamp_ms: int | None = None
    offsets: Mapping[TopicPartitionKey, int] = field(default_factory=dict)
    #: used when the group has no committed offset, or a partition is missing from ``offsets``
    fallback: Literal["earliest", "latest"] = "earliest"

    @classmethod
    def earliest(cls) -> OffsetsInitializer:
        """The first offset still in the log."""
        return cls("earliest")

    @classmethod
    def latest(cls) -> OffsetsInitializer:
        """The high watermark (as a stop: everything in the partition when the job starts)."""
        return cls("latest")

    @classmethod
    def committed(cls, fallback: Literal["earliest", "latest"] = "earliest") -> OffsetsInitializer:
        """The consumer group's committed offsets; ``fallback`` where the group has none."""
        return cls("committed", fallback=fallback)

    @classmethod
    def timestamp(cls, timestamp_ms: int) -> OffsetsInitializer:
        """The first offset whose message timestamp is >= ``timestamp_ms`` (the high watermark if none)."""
        return cls("timestamp", timestamp_ms=timestamp_ms)

    @classmethod
    def specific(
        cls, offsets: Mapping[TopicPartitionKey, int], fallback: Literal["earliest", "latest"] = "earliest"
    ) -> OffsetsInitializer:
        """Explicit offsets; partitions not in ``offsets`` use ``fallback``."""
        return cls("offsets", offsets=dict(offsets), fallback=fallback)

    @classmethod
    def of(cls, value: object, option: str) -> OffsetsInitializer:
        """Coerce an option value (initializer, string or offsets dict); ConfigError naming ``option``."""
        if isinstance(value, OffsetsInitializer):
            init = value
        elif isinstance(value, str) and value in ("earliest", "latest", "committed"):
            init = cls(value)  # type: ignore[arg-type]
        elif isinstance(value, Mapping):
            init = cls.specific(value)
        else:
            raise ConfigError(
                f"KafkaSource: {option} must be 'earliest', 'latest', 'committed', a {{(topic, partition): "
                f"offset}} dict or an OffsetsInitializer (got {value!r})"
            )
        init.check(option)
        return init

    def check(self, option: str) -> None:
        """Raise ConfigError (naming ``option``) if this initializer is inconsistent."""
        if self.kind not in KINDS:
            raise ConfigError(f"KafkaSource: {option}.kind must be one of {KINDS} (got {self.kind!r})")
        if self.fallback not in FALLBACKS:
            raise ConfigError(
                f"KafkaSource: {option}.fallback must be one of {FALLBACKS} (got {self.fallback!r})"
            )
        if self.kind == "timestamp" and (not isinstance(self.timestamp_ms, int) or self.timestamp_ms < 0):
            raise ConfigError(
                f"KafkaSource: {option}: timestamp_ms must be an integer >= 0 (got {self.timestamp_ms!r})"
            )
        for key, off in self.offsets.items():
            ok_key = (
                isinstance(key, tuple)
                and len(key) == 2
                and isinstance(key[0], str)
                and isinstance(key[1], int)
                and key[1] >= 0
            )
            if not ok_key or not isinstance(off, int) or off < 0:
                raise ConfigError(
                    f"KafkaSource: {option}: offsets must map (topic, partition) to an offset >= 0 "
                    f"(got {key!r}: {off!r})"
                )


class OffsetLookup(Protocol):
    """The broker queries offsets resolution needs (a consumer in production, a fake in unit tests)."""

    def watermarks(self, tps: list[TopicPartitionKey]) -> dict[TopicPartitionKey, tuple[int, int]]:
        """``(low, high)`` watermark per partition."""
        ...

    def committed(self, tps: list[TopicPartitionKey]) -> dict[TopicPartitionKey, int | None]:
        """The group's committed offset per partition (None where there is none)."""
        ...

    def for_times(
        self, tps: list[TopicPartitionKey], timestamp_ms: int
    ) -> dict[TopicPartitionKey, int | None]:
        """First offset with timestamp >= ``timestamp_ms`` per partition (None if there is none)."""
        ...


def resolve_offsets(
    init: OffsetsInitializer, tps: list[TopicPartitionKey], lookup: OffsetLookup
) -> dict[TopicPartitionKey, int]:
    """Resolve ``init`` to a concrete offset for every partition in ``tps``."""
    if not tps:
        return {}
    marks = lookup.watermarks(tps)

    def symbolic(kind: str, tp: TopicPartitionKey) -> int:
        low, high = marks[tp]
        return low if kind == "earliest" else high

    if init.kind in ("earliest", "latest"):
        return {tp: symbolic(init.kind, tp) for tp in tps}
    if init.kind == "committed":
        found = lookup.committed(tps)
        return {
            tp: off if (off := found.get(tp)) is not None and off >= 0 else symbolic(init.fallback, tp)
            for tp in tps
        }
    if init.kind == "timestamp":
        assert init.timestamp_ms is not None
        found = lookup.for_times(tps, init.timestamp_ms)
        return {
            tp: off if (off := found.get(tp)) is not None and off >= 0 else symbolic("latest", tp)
            for tp in tps
        }
    return {tp: init.offsets[tp] if tp in init.offsets else symbolic(init.fallback, tp) for tp in tps}


def split_id(topic: str, partition: int) -> str:
    """The split id of a partition: ``"topic:partition"``."""
    return f"{topic}:{partition}"


def parse_split_id(sid: str) -> TopicPartitionKey:
    """Inverse of :func:`split_id` (topic names cannot contain ``:``)."""
    topic, _, partition = sid.rpartition(":")
    return topic, int(partition)


def owner_of(topic: str, partition: int, parallelism: int) -> int:
    """The reader a partition is assigned to: stable across runs and processes (no ``hash()`` salt).

    Partitions of one topic go round-robin over the readers, starting at a reader chosen by the topic.
    """
    return (zlib.crc32(topic.encode()) + partition) % parallelism
