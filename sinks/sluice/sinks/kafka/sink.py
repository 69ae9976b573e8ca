"""``KafkaSink``: rows as records of one Kafka topic, exactly once (write-ahead transactions), at least once, or
best effort."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa
from sluice.errors import ConfigError, SluiceError
from sluice.serializers import SimpleVersionedSerializer
from sluice.sink import Committer, Sink, SinkContext, SinkWriter
from sluice.sinks.kafka.encoding import value_columns
from sluice.sinks.kafka.options import KafkaSinkOptions, redact, redact_text
from sluice.sinks.kafka.registry import avro_schema
from sluice.sinks.kafka.transactions import KafkaCommittable, KafkaCommittableSerializer
from sluice.sinks.options import refuse_renamed

__all__ = ["KafkaSink"]

log = logging.getLogger("sluice.sinks.kafka")


class KafkaSink(Sink[KafkaCommittable]):
    """Rows become records of ``topic``.

    ``delivery="exactly_once"`` (the default): each writer subtask stages its encoded records of a checkpoint
    in that checkpoint; when it completes, a committer publishes them in one Kafka transaction together with
    a marker (the checkpoint id as the committed offset of a consumer group of the job, sink and subtask),
    so a publish repeated after a crash is recognised and skipped. Readers with
    ``isolation.level=read_committed`` see a checkpoint's records once it completed and was published.
    ``"at_least_once"``: records are produced at once and acknowledged before each checkpoint completes
    (a restore may repeat some). ``"none"``: produced at once, no wait. See ``docs/kafka_postgres.md``.

    Args:
        bootstrap_servers: the brokers.
        topic: the topic (it must exist).
        delivery: ``"exactly_once"``, ``"at_least_once"`` or ``"none"``.
        value_format: ``"json"``, ``"avro"`` or ``"json_schema"`` (the schema registry's wire format), or
            ``"raw"`` (one column's bytes).
        key_columns: the columns of the message key; none: records without a key, spread round robin over
            the partitions.
        key_format: as ``value_format`` (default ``"raw"``: one column's bytes, text as UTF-8).
        name: the sink operator's name.
        **options: the rest of :class:`KafkaSinkOptions`: ``value_columns``, ``value_schema``,
            ``key_schema``, ``value_subject``, ``key_subject``, ``header_columns``, ``headers``,
            ``partition_by``, ``timestamp_column``,
            ``schema_registry``, ``producer_config``, ``transactional_id_prefix``, ``marker_topic``,
            ``lineage_header``, ``transaction_timeout_s``.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        delivery: str = "exactly_once",
        value_format: str = "json",
        key_columns: Sequence[str] | str = (),
        key_format: str = "raw",
        name: str = "kafka-sink",
        **options: Any,
    ) -> None:
        refuse_renamed("KafkaSink", options, strict=False)
        given: dict[str, Any] = {"bootstrap_servers": bootstrap_servers, "topic": topic, "delivery": delivery,
                                 "value_format": value_format, "key_columns": key_columns, "key_format": key_format}
        self.options = KafkaSinkOptions(**given, **options)
        self.name = name
        self.options.check_producer_config()

    def __repr__(self) -> str:  # never shows producer secrets
        o = self.options
        return f"KafkaSink({o.bootstrap_servers!r}, {o.topic!r}, delivery={o.delivery!r}, value_format={o.value_format!r})"

    def producer_config(self) -> dict[str, Any]:
        """The producer settings with secrets replaced by ``***`` (for display)."""
        return redact(self.options.producer_settings())

    def validate_schema(self, schema: pa.Schema) -> None:
        """At build time: the columns the options name are in the stream, with usable types."""
        o = self.options
        named = {"key_columns": list(o.key_columns), "header_columns": list(o.header_columns)}
        if o.value_columns is not None:
            named["value_columns"] = list(o.value_columns)
        for opt in ("partition_by", "timestamp_column"):
            if getattr(o, opt) is not None:
                named[opt] = [getattr(o, opt)]
        for opt, cols in named.items():
            missing = [c for c in cols if c not in schema.names]
            if missing:
                raise ConfigError(
                    f"KafkaSink {o.topic}: {opt} names column(s) {missing} not in the stream ({schema.names})"
                )
        values = value_columns(o, schema)
        if o.value_format == "raw" and len(values) != 1:
            raise ConfigError(
                f"KafkaSink {o.topic}: value_format 'raw' writes one column, and the value would be {values}: "
                "name it in value_columns"
            )
        if o.partition_by is not None and not pa.types.is_integer(schema.field(o.partition_by).type):
            raise ConfigError(
                f"KafkaSink {o.topic}: partition_by column {o.partition_by!r} must hold integers"
            )
        if o.value_format == "avro" and o.value_schema is None:
            avro_schema(
                pa.schema([schema.field(v) for v in values]), "value"
            )  # raises for a type without one

    # -- Sink SPI --------------------------------------------------------------------------------------
    def create_writer(self, ctx: SinkContext, restored: list[Any]) -> SinkWriter[KafkaCommittable]:
        from sluice.sinks.kafka.writer import ProducingWriter, StagingWriter

        if self.options.delivery == "exactly_once":
            return StagingWriter(self.options, ctx)
        return ProducingWriter(self.options, ctx)

    def create_committer(self, ctx: SinkContext) -> Committer[KafkaCommittable] | None:
        from sluice.sinks.kafka.writer import TransactionalCommitter

        return TransactionalCommitter(self.options, ctx) if self.options.delivery == "exactly_once" else None

    def committable_serializer(self) -> SimpleVersionedSerializer[KafkaCommittable]:
        """Staged records go into checkpoints as an Arrow IPC stream behind a small JSON header (no pickle)."""
        return KafkaCommittableSerializer()

    def committed_checkpoint(self, job_id: str, sink_uid: str) -> int | None:
        """exactly_once: the highest checkpoint of ``job_id`` any writer subtask's marker records (0 if none).

        Each marker group's transactional id is fenced first (earlier attempts' open transactions aborted,
        a commit in flight completed), so the marker read is final: no transaction of an earlier attempt can
        move it afterwards.
        """
        if self.options.delivery != "exactly_once":
            return None
        from sluice.sinks.kafka.markers import marker_groups, read_markers

        groups = marker_groups(self.options, job_id)
        self._fence(groups)
        return max(read_markers(self.options, groups).values(), default=0)

    def probe(self) -> None:
        """At job start: a broker of ``bootstrap_servers`` answers (within 30 s, or the transaction timeout if
        shorter) and ``topic`` (and ``marker_topic``) exist: the sink does not create topics."""
        from sluice.sinks.kafka.writer import partition_count

        timeout = min(30.0, self.options.transaction_timeout_s)
        partition_count(self.options, timeout=timeout)
        if self.options.marker_topic is not None:
            partition_count(self.options, self.options.marker_topic, timeout=timeout)

    def recover(self, job_id: str, committables: Sequence[KafkaCommittable]) -> None:
        """exactly_once, before the job starts: check the topics, then abort the open transactions earlier
        attempts left (a new producer per transactional id of the job and sink: the restored checkpoint's, and
        every one with a marker), so read_committed consumers are not held back until they time out."""
        if self.options.delivery != "exactly_once":
            return
        from sluice.sinks.kafka.markers import marker_groups
        from sluice.sinks.kafka.writer import partition_count

        partition_count(self.options)
        if self.options.marker_topic is not None:
            partition_count(self.options, self.options.marker_topic)
        self._fence({c.transactional_id for c in committables} | set(marker_groups(self.options, job_id)))

    def _fence(self, transactional_ids: Iterable[str]) -> None:
        from confluent_kafka import KafkaException
        from sluice.sinks.kafka.markers import fence

        try:
            fence(self.options, sorted(transactional_ids))
        except KafkaException as exc:
            raise SluiceError(
                f"KafkaSink {self.options.topic}: aborting earlier transactions failed: "
                + redact_text(str(exc), self.options.producer_config)
            ) from None
