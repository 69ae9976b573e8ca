"""``KafkaSource``: topic partitions as splits, offsets in checkpoints, vectorized decoding to Arrow."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
from sluice.connectors.kafka.config import (
    DEFAULT_BROKER_UNAVAILABLE_TIMEOUT_S,
    DEFAULT_MAX_RECORD_BYTES,
    redact,
)
from sluice.connectors.kafka.formats import Decoder
from sluice.connectors.kafka.formats.schema_registry import SchemaRegistry
from sluice.connectors.kafka.offsets import OffsetsInitializer, RunState
from sluice.connectors.kafka.options import READERS, KafkaSourceOptions
from sluice.connectors.options import OptionAttributes
from sluice.durations import Duration
from sluice.errors import ConfigError
from sluice.serializers import SimpleVersionedSerializer
from sluice.source import (
    Boundedness,
    EnumeratorContext,
    ReaderContext,
    Source,
    SourceReader,
    SourceSplit,
    SplitEnumerator,
)

__all__ = ["KafkaSource"]

#: overrides ``reader="auto"`` where a source is built (tests run both readers through it)
READER_ENV = "SLUICE_KAFKA_READER"


def _reader_from_env() -> str:
    value = os.environ.get(READER_ENV) or "auto"
    if value not in READERS:
        raise ConfigError(f"KafkaSource: {READER_ENV} must be one of {READERS} (got {value!r})")
    return value


class KafkaSource(OptionAttributes[KafkaSourceOptions], Source):
    """Reads Kafka topics with exactly-once positions kept in sluice's checkpoints.

    Every topic partition is a split (``"topic:partition"``), assigned to reader
    ``(crc32(topic) + partition) % parallelism``. A split's checkpointed position is the next offset to read;
    a restore seeks exactly there. Offsets are committed to the consumer group when a checkpoint completes,
    for lag monitoring only.

    Args:
        bootstrap_servers: ``host:port[,host:port...]``.
        topics: a topic name or list of names (missing topics fail at start).
        topic_pattern: a regular expression matched against whole topic names (instead of ``topics``);
            matching topics created while the job runs are picked up by discovery.
        format: ``"raw"`` (columns key, value, headers, topic, partition, offset, timestamp), ``"json"``
            (one object per value), ``"csv"`` (one row per value, no header), ``"avro"``, the change formats
            ``"debezium-json"``, ``"debezium-avro"``, ``"upsert-json"``, ``"upsert-avro"`` (change batches of
            :mod:`sluice.changes`; the registry :data:`~sluice.connectors.kafka.formats.FORMATS`), or a decoder of your own: an object with
            ``decode_messages(messages) -> Decoded`` (:class:`~sluice.connectors.kafka.formats.Decoder`),
            copied for each reader.
        schema: Arrow schema of the decoded values: unknown fields are dropped, missing ones are null. If
            None: json/csv infer it once from a sample across partitions and widen it (int -> double,
            null -> any type, new fields); avro and registry formats take it from the Avro/JSON schemas.
        schema_registry: URL (or :class:`~sluice.connectors.kafka.formats.schema_registry.SchemaRegistry`) of a
            Confluent-compatible schema registry: values are in the Confluent wire format (magic byte,
            schema id) and their schemas are fetched by id, once. With ``"avro"`` or ``"json"``.
        avro_schema: Avro schema (JSON text or dict). Without a registry: the writer schema of plain Avro
            values (required). With one: the reader schema every schema id is resolved to (default: the
            newest id seen).
        format_options: options of the change formats (``debezium-json``, ``debezium-avro``, ``upsert-json``,
            ``upsert-avro``): key columns, tombstones, extra columns (docs/kafka.md, "Change formats"); a
            dict or a :class:`~sluice.connectors.kafka.formats.change_options.DebeziumOptions` /
            ``UpsertOptions``.
        schema_sample_size: json/csv without a schema: records per partition the enumerator samples at
            start to infer the schema (0: each reader infers from its first batch).
        include_metadata: json/csv: add ``_key``, ``_topic``, ``_partition``, ``_offset``, ``_timestamp``.
        csv_delimiter: csv field delimiter.
        starting_offsets: ``"earliest"``, ``"latest"``, ``"committed"`` (fallback earliest), an
            ``{(topic, partition): offset}`` dict, or an :class:`OffsetsInitializer`.
        stopping_offsets: makes the source bounded: ``"latest"`` (the end offsets at start), a dict, or
            ``OffsetsInitializer.timestamp(ms)``; each split ends there (exclusive).
        group_id: consumer group offsets are committed to (default ``sluice-<job id>``); required by
            ``starting_offsets="committed"``.
        commit_offsets_on_checkpoint: commit each completed checkpoint's offsets to the group.
        on_bad_record: ``"fail"`` (raise BadRecordError) or ``"dead_letter"`` (emit the raw record and the
            error to the ``"dead_letters"`` side output: ``stream.side_output("dead_letters").sink(...)``).
        max_record_bytes: the largest value json/csv/avro decode (default 1 MiB, Kafka's default
            ``message.max.bytes``); a larger one is a bad record (``on_bad_record``). Raise it with the
            brokers' ``message.max.bytes`` (and the topic's ``max.message.bytes``).
        event_time: ``"kafka"`` (the message timestamp) or the name of a decoded column (int64 ms or
            timestamp); None = no watermarks.
        max_out_of_orderness_ms: watermark = max timestamp seen in a partition minus this.
        idle_timeout_s: a partition without records for this long is left out of the watermark; None = never.
        discovery_interval_s: time between checks for new partitions and topics (unbounded); None = off.

        Durations (:mod:`sluice.durations`) are ``"30 s"``, ``"5 min"``, a timedelta, or a bare number in the
        unit the option's name ends with (``idle_timeout_s=3``, ``max_out_of_orderness_ms=5000``).
        fail_on_data_loss: raise KafkaDataLossError when a position is out of range (records deleted); if
            False, log, count ``data_loss_resets`` and continue from the earliest offset.
        consumer_config: librdkafka settings (security: ``security.protocol``, ``sasl.*``, ``ssl.*``; fetch
            tuning). Secret values are never logged or shown.
        batch_size: maximum messages per ``consume`` call and emitted batch.
        poll_timeout_ms: how long ``poll_next`` waits for messages (keep it small: checkpoints wait on it).
        fetch_thread: consume in a background thread while the task decodes and writes (positions stay
            those of the emitted records, so exactly-once is unchanged); False consumes in ``poll_next``.
        max_prefetch_bytes: memory budget per reader for fetched-but-not-emitted values: half for the
            fetch thread's hand-over queue, half for librdkafka's queue (``queued.max.messages.kbytes``,
            ``fetch.max.bytes``), so a slow sink stops the fetching.
        request_timeout_s: bound on metadata and offset requests (an unreachable broker fails after this).
        broker_unavailable_timeout_s: a reader that reaches no broker shows as stalled at once, and after
            this many seconds fails over to a restart (a recoverable error naming the brokers and the
            cause), so an outage costs restarts instead of a job that hangs. None: wait for ever.
        reader: ``"auto"`` (the native reader where it is built and can take ``consumer_config``, today's
            otherwise; the environment variable ``SLUICE_KAFKA_READER``, where the source is built, may
            pin it), ``"native"``
            (fetch and decoding in native code without the GIL; refused when it cannot run) or ``"python"``
            (confluent-kafka; :mod:`sluice.connectors.kafka.native_reader`). Either reader has the same
            semantics; one log line per source says which one runs.
        name: the source's name in metrics, errors and the graph.

    The options are checked when the job is built (:meth:`validate`) into the frozen :attr:`options`
    (:class:`~sluice.connectors.kafka.options.KafkaSourceOptions`), which the enumerator and readers get;
    each option reads as an attribute too (``src.topics``).
    """

    options_model = KafkaSourceOptions

    def __init__(
        self,
        bootstrap_servers: str,
        topics: str | Sequence[str] | None = None,
        *,
        topic_pattern: str | re.Pattern[str] | None = None,
        format: str | Decoder = "raw",
        schema: pa.Schema | None = None,
        schema_registry: str | SchemaRegistry | None = None,
        avro_schema: str | Mapping[str, Any] | None = None,
        format_options: Mapping[str, Any] | None = None,
        schema_sample_size: int = 1000,
        include_metadata: bool = False,
        csv_delimiter: str = ",",
        starting_offsets: OffsetsInitializer | str | Mapping[tuple[str, int], int] = "earliest",
        stopping_offsets: OffsetsInitializer | str | Mapping[tuple[str, int], int] | None = None,
        group_id: str | None = None,
        commit_offsets_on_checkpoint: bool = True,
        on_bad_record: str = "fail",
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        event_time: str | None = None,
        max_out_of_orderness_ms: Duration = 0,
        idle_timeout_s: Duration | None = None,
        discovery_interval_s: Duration | None = 10.0,
        fail_on_data_loss: bool = True,
        consumer_config: Mapping[str, Any] | None = None,
        batch_size: int = 10_000,
        poll_timeout_ms: Duration = 20,
        fetch_thread: bool = True,
        max_prefetch_bytes: int = 64 * 1024 * 1024,
        request_timeout_s: Duration = 10.0,
        broker_unavailable_timeout_s: Duration | None = DEFAULT_BROKER_UNAVAILABLE_TIMEOUT_S,
        reader: str = "auto",
        name: str = "kafka",
    ) -> None:
        if reader == "auto":  # the environment may pin the default (it travels with the options from here)
            reader = _reader_from_env()
        self._take(locals())
        self.name = name
        #: what the enumerators of a run share across its failover attempts
        self._run = RunState()

    def __repr__(self) -> str:
        given = self._given
        topics, pattern = given["topics"], given["topic_pattern"]
        what = (
            f"topics={[topics] if isinstance(topics, str) else list(topics) if isinstance(topics, tuple) else topics!r}"
            if topics is not None
            else f"topic_pattern={pattern.pattern if isinstance(pattern, re.Pattern) else pattern!r}"
        )
        conf = given["consumer_config"]
        shown = redact(conf) if isinstance(conf, Mapping) else conf or {}
        return (
            f"KafkaSource(name={self.name!r}, bootstrap_servers={given['bootstrap_servers']!r}, {what}, "
            f"format={given['format']!r}, consumer_config={shown!r})"
        )

    # -- Source ----------------------------------------------------------------------------------------
    @property
    def side_outputs(self) -> tuple[str, ...]:
        return self.options.side_outputs

    @property
    def boundedness(self) -> Boundedness:
        return Boundedness.BOUNDED if self._given["stopping_offsets"] is not None else Boundedness.CONTINUOUS

    @property
    def output_schema(self) -> pa.Schema | None:
        """``raw``: its fixed columns; json/csv with an explicit ``schema``: it (plus metadata columns)."""
        return self.options.output_schema

    @property
    def discovery_interval(self) -> float | None:
        return self.options.discovery_interval_s if self.boundedness is Boundedness.CONTINUOUS else None

    def create_enumerator(self, ctx: EnumeratorContext, restored: Any | None) -> SplitEnumerator:
        from sluice.connectors.kafka.enumerator import KafkaSplitEnumerator

        return KafkaSplitEnumerator(self.options, self._run, ctx, restored)

    def create_reader(self, ctx: ReaderContext) -> SourceReader:
        from sluice.connectors.kafka.native_reader import create_reader

        return create_reader(self.options, ctx)

    def split_serializer(self) -> SimpleVersionedSerializer[SourceSplit]:
        """Splits go into checkpoints as JSON (:mod:`sluice.connectors.kafka.serializers`)."""
        from sluice.connectors.kafka.serializers import KafkaSplitSerializer

        return KafkaSplitSerializer()

    def enumerator_state_serializer(self) -> SimpleVersionedSerializer[Any]:
        """The enumerator's state goes into checkpoints as JSON."""
        from sluice.connectors.kafka.serializers import KafkaEnumeratorStateSerializer

        return KafkaEnumeratorStateSerializer()
