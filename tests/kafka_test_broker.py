"""What the tests do with a Kafka broker, whichever broker it is: the base of :class:`tests.kafka_broker.
TansuBroker` (fast, no JVM, some quirks) and :class:`tests.apache_kafka.ApacheKafkaBroker` (the real thing).

A test that takes either broker uses only this API: ``bootstrap``, ``admin``, ``create_topic``,
``add_partitions``, ``produce``, ``end_offsets`` and ``read_committed``. Broker-specific work-arounds live in
the subclass of the broker that needs them, never here.

:func:`read_committed` is the independent judge of what a transactional writer made visible: a plain
confluent-kafka consumer with ``isolation.level=read_committed``, no sluice code and no reinterpretation by
headers, so a record committed twice appears twice.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic  # type: ignore[attr-defined]

__all__ = ["KafkaTestBroker", "Record", "read_committed"]


@dataclass(frozen=True)
class Record:
    """One record as a consumer received it."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int

    def header(self, name: str) -> bytes | None:
        """The value of the first header called ``name`` (``None`` if absent)."""
        return next((v for k, v in self.headers if k == name), None)


def read_committed(bootstrap: str, topic: str, timeout: float = 60.0) -> list[Record]:
    """Every record of ``topic`` a ``read_committed`` consumer sees, in (partition, offset) order.

    Each partition is read from its start up to its last stable offset (the consumer's end of partition),
    so records of aborted transactions are left out by the broker and an open transaction stops the read
    at its first record. Nothing is deduplicated.

    Raises:
        RuntimeError: the topic is unknown, or a partition's end was not reached within ``timeout``.
    """
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": "sluice-tests-read-committed",
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
        "enable.partition.eof": True,
        "fetch.wait.max.ms": 10,  # the end of a partition needs one empty fetch
        "log_level": 0,
    })
    out: list[Record] = []
    try:
        meta = consumer.list_topics(topic=topic, timeout=timeout).topics.get(topic)
        if meta is None or meta.error is not None:
            raise RuntimeError(f"topic {topic!r} not found: {meta.error if meta else 'missing'}")
        todo = set(meta.partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in todo])
        deadline = time.monotonic() + timeout
        while todo and time.monotonic() < deadline:
            for m in consumer.consume(10000, 0.2):
                err = m.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        raise KafkaException(err)
                    todo.discard(m.partition())
                    continue
                part, offset = m.partition(), m.offset()
                assert part is not None and offset is not None
                out.append(Record(part, offset, m.key(), m.value(), tuple(m.headers() or ()), m.timestamp()[1]))
        if todo:
            raise RuntimeError(f"timed out reading {topic!r} to its last stable offset: partitions {sorted(todo)}")
    finally:
        consumer.close()
    return sorted(out, key=lambda r: (r.partition, r.offset))


class KafkaTestBroker:
    """The helpers the tests need on a running broker; a subclass provides ``bootstrap`` and ``admin``."""

    @property
    def bootstrap(self) -> str:
        """``host:port`` for ``bootstrap.servers``."""
        raise NotImplementedError

    @property
    def admin(self) -> AdminClient:
        """A shared AdminClient bound to this broker."""
        raise NotImplementedError

    @property
    def _tools_bootstrap(self) -> str:
        """Where the helpers' own clients connect (a broker may give them a way around a fault proxy)."""
        return self.bootstrap

    def create_topic(
        self, name: str, partitions: int = 1, timeout: float = 10.0, config: Mapping[str, str] | None = None
    ) -> None:
        """Create ``name`` with ``partitions`` partitions (and topic ``config``) and wait until metadata
        shows it."""
        new = NewTopic(name, num_partitions=partitions, replication_factor=1, config=dict(config or {}))
        self.admin.create_topics([new])[name].result(timeout=timeout)
        self._wait_partitions(name, partitions, timeout)

    def add_partitions(self, name: str, total: int, timeout: float = 30.0) -> None:
        """Grow ``name`` to ``total`` partitions (CreatePartitions) and wait until metadata shows them."""
        self.admin.create_partitions([NewPartitions(name, total)])[name].result(timeout=timeout)
        self._wait_partitions(name, total, timeout)

    def produce(
        self,
        topic: str,
        values: Sequence[bytes | None],
        partition: int | None = None,
        keys: Sequence[bytes | None] | None = None,
        timeout: float = 60.0,
    ) -> None:
        """Produce ``values`` (optionally with ``keys``) and flush; raise on any delivery error.

        Records are batched (``linger.ms=5``). With ``partition=None`` the default partitioner is used (key
        hash, or sticky for null keys).
        """
        if keys is not None and len(keys) != len(values):
            raise ValueError("keys and values must have the same length")
        producer = self._producer()
        errors: list[str] = []
        for i, value in enumerate(values):
            key = keys[i] if keys is not None else None
            self._produce_one(producer, errors, topic, value, key, partition)
        self._finish(producer, errors, topic, timeout)

    def end_offsets(self, topic: str, timeout: float = 10.0) -> dict[int, int]:
        """``{partition: high watermark}`` for every partition of ``topic`` (transaction markers and open
        transactions included)."""
        marks = self._watermarks(topic, self._partitions(topic, timeout), timeout, "read_uncommitted")
        return {p: hi for p, (_lo, hi) in marks.items()}

    def stable_offsets(self, topic: str, timeout: float = 10.0) -> dict[int, int]:
        """``{partition: last stable offset}`` of ``topic``: where a ``read_committed`` consumer stops; it
        equals :meth:`end_offsets` once no transaction is open and every commit's or abort's markers are
        written."""
        marks = self._watermarks(topic, self._partitions(topic, timeout), timeout, "read_committed")
        return {p: hi for p, (_lo, hi) in marks.items()}

    def read_committed(self, topic: str, timeout: float = 60.0) -> list[Record]:
        """:func:`read_committed` on this broker."""
        return read_committed(self._tools_bootstrap, topic, timeout)

    def _partitions(self, topic: str, timeout: float) -> list[int]:
        t = self.admin.list_topics(topic=topic, timeout=timeout).topics.get(topic)
        if t is None or t.error is not None:
            raise RuntimeError(f"topic {topic!r} not found: {t.error if t else 'missing'}")
        return sorted(t.partitions)

    def _wait_partitions(self, name: str, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        seen = -1
        while time.monotonic() < deadline:
            t = self.admin.list_topics(topic=name, timeout=timeout).topics.get(name)
            if t is not None and t.error is None:
                seen = len(t.partitions)
                if seen >= count:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"topic {name!r}: metadata shows {seen} partitions, want {count}")

    def _watermarks(
        self, topic: str, partitions: list[int], timeout: float, isolation: str = "read_committed"
    ) -> dict[int, tuple[int, int]]:
        consumer = self._consumer({"isolation.level": isolation})
        try:
            return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout) for p in partitions}
        finally:
            consumer.close()

    def _producer(self) -> Producer:
        return Producer({
            "bootstrap.servers": self._tools_bootstrap,
            "linger.ms": 5,
            "batch.num.messages": 10000,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
            "log_level": 0,
        })

    def _consumer(self, extra: dict[str, object] | None = None) -> Consumer:
        return Consumer({
            "bootstrap.servers": self._tools_bootstrap,
            "group.id": "sluice-tests-fixture",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10,  # PARTITION_EOF needs one empty long-poll
            "log_level": 0,
            **(extra or {}),
        })

    @staticmethod
    def _produce_one(
        producer: Producer,
        errors: list[str],
        topic: str,
        value: bytes | None,
        key: bytes | None,
        partition: int | None,
        **kwargs: Any,
    ) -> None:
        def on_delivery(err: object, _msg: object) -> None:
            if err is not None:
                errors.append(str(err))

        if partition is not None:
            kwargs["partition"] = partition
        if kwargs.get("timestamp") in (None, -1):
            kwargs.pop("timestamp", None)
        while True:
            try:
                producer.produce(topic, value=value, key=key, on_delivery=on_delivery, **kwargs)
                return
            except BufferError:
                producer.poll(0.1)

    @staticmethod
    def _finish(producer: Producer, errors: list[str], topic: str, timeout: float) -> None:
        remaining = producer.flush(timeout)
        if remaining:
            raise RuntimeError(f"{remaining} messages to {topic!r} not delivered in {timeout}s")
        if errors:
            raise RuntimeError(f"{len(errors)} delivery errors to {topic!r}, first: {errors[0]}")
