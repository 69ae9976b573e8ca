"""The exactly-once Kafka sink's write-ahead transactions.

librdkafka cannot commit a transaction that another producer process prepared (Flink's Java KafkaSink does
so by reaching into the producer's internals; KIP-939 has no librdkafka support), so the sink does not keep
a transaction open across a checkpoint. Instead a writer stages its checkpoint's encoded records in the
checkpoint itself (the committable, :class:`KafkaCommittable`), and once the checkpoint completed a
committer publishes them in one transaction that also commits a **marker**: the offset of the consumer
group named like the transactional id, on partition 0 of the marker topic, set to the checkpoint id
(``send_offsets_to_transaction``). Records and marker become visible together or not at all.

One transactional id per (job, sink, writer subtask), ``<prefix>-<subtask>``: every commit of a writer
subtask's records, from whichever committer and attempt, goes through it, so ``init_transactions`` fences
the producer of an earlier attempt (a zombie) and aborts its open transaction before the marker is read.
A committable whose checkpoint is at most the marker is already published and is skipped: the re-commit
after a restore publishes nothing twice.
"""

from __future__ import annotations

import json
import logging
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from sluice.errors import CommitError
from sluice.serializers import SimpleVersionedSerializer
from sluice.sinks.kafka.encoding import producer_rows
from sluice.sinks.kafka.options import KafkaSinkOptions, redact_text

__all__ = [
    "KafkaCommittable",
    "KafkaCommittableSerializer",
    "Publisher",
    "marker_consumer",
    "publish_error",
    "read_marker",
]

log = logging.getLogger("sluice.sinks.kafka")


@dataclass(frozen=True)
class KafkaCommittable:
    """A writer subtask's encoded records of one checkpoint, staged in the checkpoint until published.

    Attributes:
        transactional_id: the writer subtask's transactional id (also its marker group).
        subtask: the writer subtask.
        checkpoint_id: the checkpoint whose pre-commit staged the records.
        records: the records (:data:`~sluice.sinks.kafka.encoding.STAGED` columns and header columns).
    """

    transactional_id: str
    subtask: int
    checkpoint_id: int
    records: pa.Table = field(compare=False)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, KafkaCommittable)
            and (self.transactional_id, self.subtask, self.checkpoint_id)
            == (other.transactional_id, other.subtask, other.checkpoint_id)
            and self.records.equals(other.records)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:  # records can be large
        return (
            f"KafkaCommittable({self.transactional_id!r}, checkpoint={self.checkpoint_id}, "
            f"records={self.records.num_rows})"
        )


class KafkaCommittableSerializer(SimpleVersionedSerializer[KafkaCommittable]):
    """``b"SKC1"``, the length of a JSON header (4 bytes, big-endian), the header (transactional id, subtask,
    checkpoint), then the records as an Arrow IPC stream. No pickle: reading it runs no code."""

    _MAGIC = b"SKC1"

    @property
    def version(self) -> int:
        return 1

    def serialize(self, obj: KafkaCommittable) -> bytes:
        head = json.dumps(
            {"txn": obj.transactional_id, "subtask": obj.subtask, "checkpoint": obj.checkpoint_id}
        ).encode()
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, obj.records.schema) as w:
            w.write_table(obj.records)
        body: bytes = sink.getvalue().to_pybytes()
        return self._MAGIC + struct.pack(">I", len(head)) + head + body

    def deserialize(self, version: int, data: bytes) -> KafkaCommittable:
        if version != 1:
            raise ValueError(f"KafkaCommittableSerializer reads version 1, not {version}")
        if data[:4] != self._MAGIC:
            raise ValueError("not a Kafka sink committable (bad magic bytes)")
        (n,) = struct.unpack(">I", data[4:8])
        head = json.loads(data[8 : 8 + n])
        records = pa.ipc.open_stream(pa.py_buffer(data[8 + n :])).read_all()
        return KafkaCommittable(str(head["txn"]), int(head["subtask"]), int(head["checkpoint"]), records)


def marker_consumer(options: KafkaSinkOptions, group: str) -> Any:
    """A consumer of the marker group (never subscribes: it reads the marker and gives the group's metadata).

    It asks for stable offsets (``isolation.level=read_committed`` makes librdkafka's OffsetFetch set
    ``require_stable``): the broker answers ``UNSTABLE_OFFSET_COMMIT``, which librdkafka retries, while a
    transaction carrying an offset of the group is not settled. The marker is read after
    ``init_transactions``, which returns once every earlier transaction of the id is complete; a broker
    whose group coordinator applies the committed offsets of a finished transaction only after that (the
    classic coordinator of Kafka 3.x schedules it after the marker is written) would otherwise answer with
    the marker of the checkpoint before, and a published checkpoint would be published again.
    """
    from confluent_kafka import Consumer

    settings = options.client_settings(**{"group.id": group, "enable.auto.commit": False})
    return Consumer({**settings, "isolation.level": "read_committed"})


def read_marker(consumer: Any, options: KafkaSinkOptions, timeout: float) -> int:
    """The checkpoint id the marker group last committed (0 if none)."""
    from confluent_kafka import TopicPartition

    (tp,) = consumer.committed([TopicPartition(options.marker, 0)], timeout=timeout)
    if tp.error is not None:
        raise CommitError(f"KafkaSink {options.topic}: cannot read marker of group {consumer!r}: {tp.error}")
    return max(0, int(tp.offset))


class Publisher:
    """Publishes the committables of one transactional id; created anew after any failure (a new producer
    fences the old one and resolves its transaction before the marker is read again)."""

    def __init__(self, options: KafkaSinkOptions, transactional_id: str) -> None:
        from confluent_kafka import Producer

        self.options = options
        self.transactional_id = transactional_id
        self.timeout = options.transaction_timeout_s
        self.producer = Producer(options.producer_settings(transactional_id))
        self.consumer = marker_consumer(options, transactional_id)
        try:
            self.producer.init_transactions(self.timeout)  # fences zombies, aborts their open transaction
            self.marker = read_marker(self.consumer, options, self.timeout)
        except BaseException:
            self.close()
            raise

    def publish(self, c: KafkaCommittable, hook: Callable[[str], None]) -> bool:
        """Publish ``c`` with its marker in one transaction; False if the marker says it is published."""
        from confluent_kafka import TopicPartition

        if c.checkpoint_id <= self.marker:
            return False
        p = self.producer
        extra = []
        if self.options.lineage_header is not None:
            tag = f"{self.transactional_id}:{c.checkpoint_id}:{uuid.uuid4().hex[:12]}"
            extra = [(self.options.lineage_header, tag.encode())]
        p.begin_transaction()
        topic, produce = self.options.topic, p.produce
        for value, key, part, ts, headers in producer_rows(c.records, self.options, extra):
            try:
                produce(topic, value, key, part, timestamp=ts, headers=headers)
            except BufferError:  # the producer's queue is full: wait for room, then send it
                while True:
                    p.poll(0.05)
                    try:
                        produce(topic, value, key, part, timestamp=ts, headers=headers)
                        break
                    except BufferError:
                        continue
        p.flush(self.timeout)
        hook("commit")  # in the middle of a commit: records sent, transaction open
        p.send_offsets_to_transaction(
            [TopicPartition(self.options.marker, 0, c.checkpoint_id)], self.consumer.consumer_group_metadata(),
            self.timeout,
        )  # fmt: skip
        p.commit_transaction(self.timeout)
        self.marker = c.checkpoint_id
        return True

    def close(self) -> None:
        try:
            self.consumer.close()
        except Exception:
            pass


def publish_error(options: KafkaSinkOptions, transactional_id: str, exc: BaseException) -> CommitError:
    """A failed publish as a CommitError (retried with a new publisher)."""
    text = redact_text(str(exc), options.producer_config)
    return CommitError(f"KafkaSink {options.topic}: transaction {transactional_id!r} failed: {text}")
