"""``KafkaSource``: topic partitions as splits, offsets in checkpoints, vectorized decoding to Arrow."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
from sluice.connectors.kafka.config import (
    DEFAULT_BROKER_UNAVAILABLE_TIMEOUT_S,
    DEFAULT_MAX_RECORD_BYTES,
    LIBRDKAFKA_LOG,
    MAX_RECORD_BYTES_CAP,
    TUNING,
    check_consumer_config,
    receive_max_bytes,
    redact,
)
from sluice.connectors.kafka.offsets import OffsetsInitializer
from sluice.connectors.kafka.registry import SchemaRegistry
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

__all__ = ["FORMATS", "KafkaSource"]

FORMATS = ("raw", "json", "csv", "avro")
ON_BAD_RECORD = ("fail", "dead_letter")
#: the side output dead letters go to
DEAD_LETTERS = "dead_letters"


class KafkaSource(Source):
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
            (one object per value), ``"csv"`` (one row per value, no header) or ``"avro"``.
        schema: Arrow schema of the decoded values: unknown fields are dropped, missing ones are null. If
            None: json/csv infer it once from a sample across partitions and widen it (int -> double,
            null -> any type, new fields); avro and registry formats take it from the Avro/JSON schemas.
        schema_registry: URL (or :class:`~sluice.connectors.kafka.registry.SchemaRegistry`) of a
            Confluent-compatible schema registry: values are in the Confluent wire format (magic byte,
            schema id) and their schemas are fetched by id, once. With ``"avro"`` or ``"json"``.
        avro_schema: Avro schema (JSON text or dict). Without a registry: the writer schema of plain Avro
            values (required). With one: the reader schema every schema id is resolved to (default: the
            newest id seen).
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
        discovery_interval_s: seconds between checks for new partitions and topics (unbounded); None = off.
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
        name: the source's name in metrics, errors and the graph.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topics: str | Sequence[str] | None = None,
        *,
        topic_pattern: str | re.Pattern[str] | None = None,
        format: str = "raw",
        schema: pa.Schema | None = None,
        schema_registry: str | SchemaRegistry | None = None,
        avro_schema: str | Mapping[str, Any] | None = None,
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
        max_out_of_orderness_ms: int = 0,
        idle_timeout_s: float | None = None,
        discovery_interval_s: float | None = 10.0,
        fail_on_data_loss: bool = True,
        consumer_config: Mapping[str, Any] | None = None,
        batch_size: int = 10_000,
        poll_timeout_ms: int = 20,
        fetch_thread: bool = True,
        max_prefetch_bytes: int = 64 * 1024 * 1024,
        request_timeout_s: float = 10.0,
        broker_unavailable_timeout_s: float | None = DEFAULT_BROKER_UNAVAILABLE_TIMEOUT_S,
        name: str = "kafka",
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        #: set once an enumerator of this source reached the brokers (unreachable after that: an outage)
        self.brokers_reached = False
        #: this run's stop offsets, resolved when the run starts (its failover attempts keep them)
        self.run_stops: dict[tuple[str, int], int] = {}
        self.topics = [topics] if isinstance(topics, str) else list(topics) if topics is not None else None
        self.topic_pattern = topic_pattern
        self.format = format
        self.schema = schema
        self.schema_registry = schema_registry
        self.avro_schema = dict(avro_schema) if isinstance(avro_schema, Mapping) else avro_schema
        self.schema_sample_size = schema_sample_size
        self.include_metadata = include_metadata
        self.csv_delimiter = csv_delimiter
        self.starting_offsets_option = starting_offsets
        self.stopping_offsets_option = stopping_offsets
        self.group_id = group_id
        self.commit_offsets_on_checkpoint = commit_offsets_on_checkpoint
        self.on_bad_record = on_bad_record
        self.max_record_bytes = max_record_bytes
        self.event_time = event_time
        self.max_out_of_orderness_ms = max_out_of_orderness_ms
        self.idle_timeout_s = idle_timeout_s
        self.discovery_interval_s = discovery_interval_s
        self.fail_on_data_loss = fail_on_data_loss
        self.consumer_config = dict(consumer_config or {})
        self.batch_size = batch_size
        self.poll_timeout_ms = poll_timeout_ms
        self.fetch_thread = fetch_thread
        self.max_prefetch_bytes = max_prefetch_bytes
        self.request_timeout_s = request_timeout_s
        self.broker_unavailable_timeout_s = broker_unavailable_timeout_s
        self.name = name

    def __repr__(self) -> str:
        what = (
            f"topics={self.topics!r}"
            if self.topics is not None
            else f"topic_pattern={self.pattern.pattern!r}"
        )
        return (
            f"KafkaSource(name={self.name!r}, bootstrap_servers={self.bootstrap_servers!r}, {what}, "
            f"format={self.format!r}, consumer_config={redact(self.consumer_config)!r})"
        )

    # -- options ---------------------------------------------------------------------------------------
    @property
    def pattern(self) -> re.Pattern[str]:
        """The compiled topic pattern (``topics`` as an alternation of literal names)."""
        if self.topic_pattern is not None:
            return (
                re.compile(self.topic_pattern) if isinstance(self.topic_pattern, str) else self.topic_pattern
            )
        return re.compile("|".join(re.escape(t) for t in self.topics or []))

    @property
    def starting_offsets(self) -> OffsetsInitializer:
        """``starting_offsets`` as an initializer."""
        return OffsetsInitializer.of(self.starting_offsets_option, "starting_offsets")

    @property
    def stopping_offsets(self) -> OffsetsInitializer | None:
        """``stopping_offsets`` as an initializer, or None (unbounded)."""
        if self.stopping_offsets_option is None:
            return None
        return OffsetsInitializer.of(self.stopping_offsets_option, "stopping_offsets")

    def validate(self) -> None:
        """Check every option; raise ConfigError naming the option and what is allowed."""

        def bad(option: str, allowed: str, value: Any) -> ConfigError:
            return ConfigError(f"KafkaSource: {option} must be {allowed} (got {value!r})")

        if not isinstance(self.bootstrap_servers, str) or not self.bootstrap_servers.strip():
            raise bad(
                "bootstrap_servers", "a non-empty 'host:port[,host:port]' string", self.bootstrap_servers
            )
        if (self.topics is None) == (self.topic_pattern is None):
            raise ConfigError(
                "KafkaSource: give exactly one of topics (a name or list of names) or topic_pattern"
            )
        if self.topics is not None and (
            not self.topics or not all(isinstance(t, str) and t for t in self.topics)
        ):
            raise bad("topics", "a topic name or a non-empty list of names", self.topics)
        if self.topic_pattern is not None:
            try:
                _ = self.pattern
            except (re.error, TypeError) as exc:
                raise bad(
                    "topic_pattern", f"a valid regular expression ({exc})", self.topic_pattern
                ) from None
        if self.format not in FORMATS:
            raise bad("format", f"one of {FORMATS}", self.format)
        if self.schema is not None and not isinstance(self.schema, pa.Schema):
            raise bad("schema", "a pyarrow.Schema or None", self.schema)
        if self.format == "raw" and (self.schema is not None or self.include_metadata):
            raise ConfigError(
                "KafkaSource: schema and include_metadata apply to formats 'json', 'csv' and 'avro' "
                "(format 'raw' already has the metadata columns)"
            )
        self._validate_schemas()
        if not isinstance(self.csv_delimiter, str) or len(self.csv_delimiter) != 1:
            raise bad("csv_delimiter", "a single character", self.csv_delimiter)
        start = self.starting_offsets
        stop = self.stopping_offsets
        if stop is not None and stop.kind == "committed":
            raise bad(
                "stopping_offsets",
                "'latest', a {(topic, partition): offset} dict or OffsetsInitializer.timestamp(ms)",
                "committed",
            )
        if start.kind == "committed" and self.group_id is None and "group.id" not in self.consumer_config:
            raise ConfigError(
                "KafkaSource: starting_offsets='committed' needs group_id (the group to read from)"
            )
        if self.on_bad_record not in ON_BAD_RECORD:
            raise bad("on_bad_record", f"one of {ON_BAD_RECORD}", self.on_bad_record)
        if self.event_time is not None and (not isinstance(self.event_time, str) or not self.event_time):
            raise bad(
                "event_time", "'kafka' (the message timestamp), a column name, or None", self.event_time
            )
        if self.format == "raw" and self.event_time not in (None, "kafka", "timestamp"):
            raise bad("event_time", "'kafka' or None for format 'raw'", self.event_time)
        limit = self.max_record_bytes
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_RECORD_BYTES_CAP:
            raise bad("max_record_bytes", f"an integer in 1..{MAX_RECORD_BYTES_CAP} (bytes)", limit)
        for opt, val in (
            ("max_out_of_orderness_ms", self.max_out_of_orderness_ms),
            ("batch_size", self.batch_size),
        ):
            if not isinstance(val, int) or isinstance(val, bool) or val < (1 if opt == "batch_size" else 0):
                raise bad(opt, "an integer >= " + ("1" if opt == "batch_size" else "0"), val)
        if not isinstance(self.poll_timeout_ms, int) or not 0 <= self.poll_timeout_ms <= 50:
            raise bad(
                "poll_timeout_ms",
                "an integer in 0..50 (checkpoints wait for poll_next)",
                self.poll_timeout_ms,
            )
        seconds: tuple[tuple[str, float | None], ...] = (
            ("idle_timeout_s", self.idle_timeout_s),
            ("discovery_interval_s", self.discovery_interval_s),
            ("broker_unavailable_timeout_s", self.broker_unavailable_timeout_s),
        )
        for opt, fval in seconds:
            if fval is not None and (not isinstance(fval, int | float) or fval <= 0):
                raise bad(opt, "a number of seconds > 0 or None", fval)
        if not isinstance(self.request_timeout_s, int | float) or self.request_timeout_s <= 0:
            raise bad("request_timeout_s", "a number of seconds > 0", self.request_timeout_s)
        if (
            not isinstance(self.max_prefetch_bytes, int)
            or isinstance(self.max_prefetch_bytes, bool)
            or self.max_prefetch_bytes < 4 * 1024 * 1024
        ):
            raise bad("max_prefetch_bytes", "an integer >= 4 MiB (4194304)", self.max_prefetch_bytes)
        for opt in ("commit_offsets_on_checkpoint", "fail_on_data_loss", "include_metadata", "fetch_thread"):
            if not isinstance(getattr(self, opt), bool):
                raise bad(opt, "True or False", getattr(self, opt))
        if self.group_id is not None and (not isinstance(self.group_id, str) or not self.group_id):
            raise bad("group_id", "a non-empty string or None", self.group_id)
        check_consumer_config(self.consumer_config, self.group_id, self.consumer_conf("sluice-validate", bounded=False))

    def _validate_schemas(self) -> None:
        if self.schema_registry is not None:
            if self.format not in ("avro", "json"):
                raise ConfigError(
                    f"KafkaSource: schema_registry applies to format 'avro' or 'json' (got {self.format!r})"
                )
            SchemaRegistry.of(self.schema_registry)
        if self.avro_schema is not None:
            if self.format != "avro":
                raise ConfigError(f"KafkaSource: avro_schema applies to format 'avro' (got {self.format!r})")
            from sluice.connectors.kafka.avro import AvroSchema

            AvroSchema.option(self.avro_schema)
        elif self.format == "avro" and self.schema_registry is None:
            raise ConfigError(
                "KafkaSource: format 'avro' needs schema_registry (Confluent wire format) or avro_schema "
                "(the writer schema of plain Avro values)"
            )
        n = self.schema_sample_size
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ConfigError(f"KafkaSource: schema_sample_size must be an integer >= 0 (got {n!r})")

    @property
    def infers_schema(self) -> bool:
        """Whether the value schema is inferred from the data (json/csv without schema or registry)."""
        return self.format in ("json", "csv") and self.schema is None and self.schema_registry is None

    # -- librdkafka ------------------------------------------------------------------------------------
    def consumer_conf(self, default_group: str, *, bounded: bool, reader: bool = False) -> dict[str, Any]:
        """The full librdkafka configuration of a reader (``reader=True``: within the prefetch budget) or the
        enumerator."""
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "group.id": self.group_id or default_group,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "error",
            "enable.partition.eof": bounded,
            **TUNING,
            **self.consumer_config,
        }
        if reader:  # librdkafka's queue is the other half of the prefetch budget
            half = self.max_prefetch_bytes // 2
            if "queued.max.messages.kbytes" not in self.consumer_config:
                conf["queued.max.messages.kbytes"] = max(1, half // 1024)
            if "fetch.max.bytes" not in self.consumer_config:
                conf["fetch.max.bytes"] = min(int(conf["fetch.max.bytes"]), half)
            if "max.partition.fetch.bytes" not in self.consumer_config:
                conf["max.partition.fetch.bytes"] = min(
                    int(conf["max.partition.fetch.bytes"]), int(conf["fetch.max.bytes"])
                )
        if "receive.message.max.bytes" not in self.consumer_config:
            conf["receive.message.max.bytes"] = receive_max_bytes(self.max_record_bytes, conf)
        conf.setdefault("logger", LIBRDKAFKA_LOG)
        return conf

    def admin_conf(self) -> dict[str, Any]:
        """librdkafka configuration of the enumerator's AdminClient (connection and security settings)."""
        skip = set(TUNING) | {"group.id", "isolation.level"}
        conf = {k: v for k, v in self.consumer_config.items() if k not in skip}
        conf["bootstrap.servers"] = self.bootstrap_servers
        conf.setdefault("logger", LIBRDKAFKA_LOG)
        return conf

    # -- Source ----------------------------------------------------------------------------------------
    @property
    def side_outputs(self) -> tuple[str, ...]:
        return (DEAD_LETTERS,) if self.on_bad_record == "dead_letter" else ()

    @property
    def boundedness(self) -> Boundedness:
        return Boundedness.BOUNDED if self.stopping_offsets_option is not None else Boundedness.CONTINUOUS

    @property
    def output_schema(self) -> pa.Schema | None:
        """``raw``: its fixed columns; json/csv with an explicit ``schema``: it (plus metadata columns)."""
        from sluice.connectors.kafka.columns import METADATA_FIELDS, RAW_SCHEMA

        if self.format == "raw":
            return RAW_SCHEMA
        if self.schema is None or self.schema_registry is not None or self.format == "avro":
            return None
        return pa.schema([*self.schema, *METADATA_FIELDS]) if self.include_metadata else self.schema

    @property
    def discovery_interval(self) -> float | None:
        return self.discovery_interval_s if self.boundedness is Boundedness.CONTINUOUS else None

    def create_enumerator(self, ctx: EnumeratorContext, restored: Any | None) -> SplitEnumerator:
        from sluice.connectors.kafka.enumerator import KafkaSplitEnumerator

        return KafkaSplitEnumerator(self, ctx, restored)

    def create_reader(self, ctx: ReaderContext) -> SourceReader:
        from sluice.connectors.kafka.reader import KafkaSourceReader

        return KafkaSourceReader(self, ctx)

    def split_serializer(self) -> SimpleVersionedSerializer[SourceSplit]:
        """Splits go into checkpoints as JSON (:mod:`sluice.connectors.kafka.serializers`)."""
        from sluice.connectors.kafka.serializers import KafkaSplitSerializer

        return KafkaSplitSerializer()

    def enumerator_state_serializer(self) -> SimpleVersionedSerializer[Any]:
        """The enumerator's state goes into checkpoints as JSON."""
        from sluice.connectors.kafka.serializers import KafkaEnumeratorStateSerializer

        return KafkaEnumeratorStateSerializer()
