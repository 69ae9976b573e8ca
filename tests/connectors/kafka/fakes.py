"""In-memory stand-ins for confluent-kafka messages and consumers (unit tests of the reader)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, TopicPartition


@dataclass
class FakeMessage:
    """Quacks like ``confluent_kafka.Message``."""

    t: str
    p: int
    o: int
    v: bytes | None = b"{}"
    k: bytes | None = None
    ts: int = 1_700_000_000_000
    err: KafkaError | None = None
    h: list[tuple[str, bytes]] | None = None

    def topic(self) -> str:
        return self.t

    def partition(self) -> int:
        return self.p

    def offset(self) -> int:
        return self.o

    def value(self) -> bytes | None:
        return self.v

    def key(self) -> bytes | None:
        return self.k

    def timestamp(self) -> tuple[int, int]:
        return (1, self.ts)

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self.h

    def error(self) -> KafkaError | None:
        return self.err


@dataclass
class FakeConsumer:
    """Serves queued batches from ``consume``; records assignments and commits."""

    conf: dict[str, Any]
    batches: list[list[FakeMessage]] = field(default_factory=list)
    assigned: dict[tuple[str, int], int] = field(default_factory=dict)
    commits: list[dict[tuple[str, int], int]] = field(default_factory=list)
    low: int = 0

    def incremental_assign(self, tps: list[TopicPartition]) -> None:
        for tp in tps:
            self.assigned[(tp.topic, tp.partition)] = tp.offset

    def incremental_unassign(self, tps: list[TopicPartition]) -> None:
        for tp in tps:
            self.assigned.pop((tp.topic, tp.partition), None)

    def consume(self, num_messages: int, timeout: float) -> list[FakeMessage]:
        return self.batches.pop(0) if self.batches else []

    def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> None:
        self.commits.append({(tp.topic, tp.partition): tp.offset for tp in offsets})

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        return (self.low, 1000)

    def close(self) -> None:
        pass


@dataclass
class FakeReaderContext:
    """ReaderContext with counted metrics."""

    metrics: dict[str, int] = field(default_factory=dict)
    subtask: int = 0
    parallelism: int = 1
    job_id: str = "job"
    gauges: dict[str, float] = field(default_factory=dict)

    def request_split(self) -> None:
        pass

    def metric(self, name: str, increment: int = 1) -> None:
        self.metrics[name] = self.metrics.get(name, 0) + increment

    def gauge(self, name: str, value: float) -> None:
        self.gauges[name] = value


@dataclass
class CollectingOutput:
    """ReaderOutput that keeps what it is given."""

    batches: list[Any] = field(default_factory=list)
    side: dict[str, list[Any]] = field(default_factory=dict)
    watermarks: list[int] = field(default_factory=list)
    idle: int = 0

    def mark_idle(self) -> None:
        self.idle += 1

    def emit(self, batch: Any) -> None:
        self.batches.append(batch)

    def emit_side(self, tag: str, batch: Any) -> None:
        self.side.setdefault(tag, []).append(batch)

    def emit_watermark(self, timestamp_ms: int) -> None:
        self.watermarks.append(timestamp_ms)


def eof(topic: str, partition: int, offset: int) -> FakeMessage:
    """The partition-EOF event librdkafka reports at ``offset``."""
    return FakeMessage(topic, partition, offset, v=None, err=KafkaError(KafkaError._PARTITION_EOF))


def out_of_range(topic: str, partition: int) -> FakeMessage:
    """The error librdkafka reports when ``auto.offset.reset=error`` meets an out-of-range offset."""
    return FakeMessage(topic, partition, -1001, v=None, err=KafkaError(KafkaError._AUTO_OFFSET_RESET))
