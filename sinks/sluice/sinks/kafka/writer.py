"""The Kafka sink's writers and committer.

* ``exactly_once``: :class:`StagingWriter` encodes rows as they come and hands the checkpoint's records over
  at pre-commit (they travel in the checkpoint); :class:`TransactionalCommitter` publishes them once the
  checkpoint completed (:mod:`sluice.sinks.kafka.transactions`).
* ``at_least_once``: :class:`ProducingWriter` produces at once (idempotent producer) and waits at every
  pre-commit until the broker acknowledged everything: a checkpoint never covers an unsent record, and a
  restore may send records a second time.
* ``none``: the same, without the wait: records still buffered in the producer when a crash hits are lost.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from sluice.errors import CommitError, ConfigError, SluiceError
from sluice.sink import CommitOutcome, Committer, SinkContext, SinkWriter
from sluice.sinks.kafka.encoding import RecordEncoder, producer_rows
from sluice.sinks.kafka.options import KafkaSinkOptions, redact_text
from sluice.sinks.kafka.transactions import KafkaCommittable, Publisher, publish_error

__all__ = ["ProducingWriter", "StagingWriter", "TransactionalCommitter", "partition_count"]

log = logging.getLogger("sluice.sinks.kafka")


#: librdkafka error names a restart cannot cure: wrong credentials, no permission
_DENIED = ("_AUTHENTICATION", "SASL_AUTHENTICATION_FAILED", "TOPIC_AUTHORIZATION_FAILED",
           "CLUSTER_AUTHORIZATION_FAILED", "GROUP_AUTHORIZATION_FAILED", "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
           "_SSL")  # fmt: skip


def partition_count(options: KafkaSinkOptions, topic: str | None = None, timeout: float | None = None) -> int:
    """The number of partitions of ``topic`` (default: the sink's); ConfigError if it does not exist, a
    SluiceError if the brokers cannot be reached within ``timeout`` seconds (default the transaction
    timeout), not recoverable if they refused the credentials."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    name = topic or options.topic
    admin = AdminClient(options.client_settings())
    try:
        # all topics, not the one by name: a metadata request naming a topic may create it (tansu does)
        md = admin.list_topics(timeout=options.transaction_timeout_s if timeout is None else timeout)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        code = str(error.name()) if error is not None and hasattr(error, "name") else ""
        raise SluiceError(
            f"KafkaSink: cannot reach {options.bootstrap_servers} (bootstrap_servers, producer_config): "
            f"{redact_text(str(exc), options.producer_config)}",
            recoverable=False if code in _DENIED else None,
        ) from None
    t = md.topics.get(name)
    if t is None or t.error is not None or not t.partitions:
        raise ConfigError(
            f"KafkaSink: topic {name!r} does not exist on {options.bootstrap_servers}: create it first (the sink "
            "does not create topics)"
        )
    return len(t.partitions)


class StagingWriter(SinkWriter[KafkaCommittable]):
    """exactly_once: encodes batches; at pre-commit the checkpoint's records become one committable."""

    def __init__(self, options: KafkaSinkOptions, ctx: SinkContext) -> None:
        self.options = options
        self.ctx = ctx
        self.transactional_id = f"{options.txn_prefix(ctx.job_id)}-{ctx.subtask}"
        self._encoder: RecordEncoder | None = None
        self._staged: list[pa.RecordBatch] = []

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        if self._encoder is None:
            self._encoder = RecordEncoder(self.options, partition_count(self.options), self.ctx.subtask)
        self._staged.append(self._encoder.encode(batch))

    def prepare_commit(self, checkpoint_id: int) -> list[KafkaCommittable]:
        if not self._staged:
            return []
        staged, self._staged = self._staged, []
        records = pa.Table.from_batches(staged).combine_chunks()
        self.ctx.metric("kafka_staged_records", records.num_rows)
        return [KafkaCommittable(self.transactional_id, self.ctx.subtask, checkpoint_id, records)]


class TransactionalCommitter(Committer[KafkaCommittable]):
    """Publishes committables oldest first, one transaction (records + marker) each; one
    :class:`~sluice.sinks.kafka.transactions.Publisher` per transactional id (after a rescale a committer
    may publish what several earlier writer subtasks staged)."""

    def __init__(self, options: KafkaSinkOptions, ctx: SinkContext) -> None:
        self.options = options
        self.ctx = ctx
        self._publishers: dict[str, Publisher] = {}

    def _publisher(self, transactional_id: str) -> Publisher:
        if transactional_id not in self._publishers:
            self._publishers[transactional_id] = Publisher(self.options, transactional_id)
        return self._publishers[transactional_id]

    def commit(self, committables: Sequence[KafkaCommittable]) -> CommitOutcome:
        from confluent_kafka import KafkaException

        published = records = 0
        for c in committables:
            try:
                if self._publisher(c.transactional_id).publish(c, self.ctx.fault_hook):
                    published += 1
                    records += c.records.num_rows
            except (KafkaException, CommitError) as exc:
                self._drop(c.transactional_id)
                raise publish_error(self.options, c.transactional_id, exc) from None
        if published:
            self.ctx.metric("kafka_transactions", published)
            self.ctx.metric("kafka_published_records", records)
        return CommitOutcome.COMMITTED if published else CommitOutcome.ALREADY_COMMITTED

    def _drop(self, transactional_id: str) -> None:
        pub = self._publishers.pop(transactional_id, None)
        if pub is not None:
            pub.close()

    def close(self) -> None:
        for t in list(self._publishers):
            self._drop(t)


class ProducingWriter(SinkWriter[KafkaCommittable]):
    """at_least_once / none: produces as rows come; at_least_once flushes at every pre-commit."""

    def __init__(self, options: KafkaSinkOptions, ctx: SinkContext) -> None:
        from confluent_kafka import Producer

        self.options = options
        self.ctx = ctx
        self.producer = Producer(options.producer_settings())
        self._encoder: RecordEncoder | None = None
        self._errors: list[str] = []

    def _delivered(self, err: Any, _msg: Any) -> None:
        if err is not None and len(self._errors) < 10:
            self._errors.append(str(err))

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        if self._encoder is None:
            self._encoder = RecordEncoder(self.options, partition_count(self.options), self.ctx.subtask)
        p, topic, cb = self.producer, self.options.topic, self._delivered
        for value, key, part, ts, headers in producer_rows(self._encoder.encode(batch), self.options):
            while True:
                try:
                    p.produce(topic, value, key, part, on_delivery=cb, timestamp=ts, headers=headers)
                    break
                except BufferError:
                    p.poll(0.05)
        p.poll(0)
        self._raise_errors()

    def _raise_errors(self) -> None:
        if self._errors:
            errors, self._errors = self._errors, []
            raise CommitError(
                f"KafkaSink {self.options.topic}: {len(errors)} record(s) not delivered, first: "
                + redact_text(errors[0], self.options.producer_config)
            )

    def prepare_commit(self, checkpoint_id: int) -> list[KafkaCommittable]:
        if self.options.delivery == "at_least_once":
            left = self.producer.flush(self.options.transaction_timeout_s)
            if left:
                raise CommitError(
                    f"KafkaSink {self.options.topic}: {left} record(s) not acknowledged within "
                    f"{self.options.transaction_timeout_s:g} s"
                )
        else:
            self.producer.poll(0)
        self._raise_errors()
        return []

    def close(self) -> None:
        self.producer.flush(self.options.transaction_timeout_s)
