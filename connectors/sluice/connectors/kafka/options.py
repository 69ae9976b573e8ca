"""``KafkaSourceOptions``: every option of the Kafka source, validated once when the job is built, frozen.

Each field names what it allows (:mod:`sluice.connectors.options`): a wrong value raises one ConfigError
naming the option, what is allowed and what was given. Checks between options, the format's own checks
(:meth:`~sluice.connectors.kafka.formats.Format.check`) and librdkafka's check of ``consumer_config``
follow once every field is valid. The options are documented on
:class:`~sluice.connectors.kafka.source.KafkaSource`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import pyarrow as pa
from pydantic import BaseModel, Field, SkipValidation, model_validator
from sluice.config import _Frozen
from sluice.connectors.kafka.config import (
    DEFAULT_BROKER_UNAVAILABLE_TIMEOUT_S,
    DEFAULT_MAX_RECORD_BYTES,
    MAX_RECORD_BYTES_CAP,
    admin_conf,
    check_consumer_config,
    consumer_conf,
    redact,
)
from sluice.connectors.kafka.formats import FORMATS, Decoder, Format, format_names
from sluice.connectors.kafka.formats.messages import METADATA_FIELDS
from sluice.connectors.kafka.formats.schema_registry import SchemaRegistry
from sluice.connectors.kafka.offsets import OffsetsInitializer
from sluice.connectors.options import convert, duration, is_count, must
from sluice.errors import ConfigError

__all__ = ["DEAD_LETTERS", "ON_BAD_RECORD", "READERS", "KafkaSourceOptions"]

ON_BAD_RECORD = ("fail", "dead_letter")
#: the ``reader`` option's values (:mod:`sluice.connectors.kafka.native_reader`)
READERS = ("auto", "native", "python")
#: the side output dead letters go to
DEAD_LETTERS = "dead_letters"


_must = functools.partial(must, "KafkaSource")


def _pattern(v: Any) -> Any:
    if v is not None:
        try:
            re.compile(v)
        except (re.error, TypeError) as exc:
            raise ConfigError(
                f"KafkaSource: topic_pattern must be a valid regular expression ({exc}) (got {v!r})"
            ) from None
    return v


def _topics(v: Any) -> Any:
    if isinstance(v, str):
        return [v]
    if isinstance(v, list | tuple):
        return list(v)
    return v


def _stops(v: Any) -> OffsetsInitializer | None:
    stops = v if v is None else OffsetsInitializer.of(v, "stopping_offsets")
    if stops is not None and stops.kind == "committed":
        raise ConfigError(
            "KafkaSource: stopping_offsets must be 'latest', a {(topic, partition): offset} dict or "
            "OffsetsInitializer.timestamp(ms) (got 'committed')"
        )
    return stops


def _is_text(v: Any) -> bool:
    return isinstance(v, str) and bool(v)


def _is_names(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(t, str) and t for t in v)


def _is_format(v: Any) -> bool:
    return (isinstance(v, str) and v in FORMATS) or (isinstance(v, Decoder) and not isinstance(v, type))


_Flag = Annotated[bool, SkipValidation, _must("True or False", lambda v: isinstance(v, bool))]
_SecondsOrNone = Annotated[float | None, SkipValidation, duration("KafkaSource", none=True)]

_Count0 = Annotated[int, SkipValidation, _must("an integer >= 0", is_count(0))]
_Count1 = Annotated[int, SkipValidation, _must("an integer >= 1", is_count(1))]


class KafkaSourceOptions(_Frozen):
    """The options of one Kafka source (see :class:`~sluice.connectors.kafka.source.KafkaSource`), checked.

    ``topics`` is a list, ``starting_offsets``/``stopping_offsets`` are initializers, ``schema_registry`` is
    a :class:`SchemaRegistry`, ``consumer_config`` a dict; ``value_schema`` is the ``schema`` option.
    """

    bootstrap_servers: Annotated[
        str,
        SkipValidation,
        _must("a non-empty 'host:port[,host:port]' string", lambda v: isinstance(v, str) and bool(v.strip())),
    ]
    topics: Annotated[
        list[str] | None,
        SkipValidation,
        _must("a topic name or a non-empty list of names", lambda v: v is None or _is_names(v)),
        convert(_topics),
    ] = None
    topic_pattern: Annotated[str | re.Pattern[str] | None, SkipValidation, convert(_pattern)] = None
    format: Annotated[
        str | Decoder,
        SkipValidation,
        _must(f"one of {format_names()} or a decoder (an object with decode_messages)", _is_format),
    ] = "raw"
    value_schema: Annotated[
        pa.Schema | None,
        SkipValidation,
        Field(alias="schema"),
        _must("a pyarrow.Schema or None", lambda v: v is None or isinstance(v, pa.Schema), "schema"),
    ] = None
    schema_registry: Annotated[
        SchemaRegistry | None, SkipValidation, convert(lambda v: v if v is None else SchemaRegistry.of(v))
    ] = None
    avro_schema: Annotated[
        str | dict[str, Any] | None,
        SkipValidation,
        convert(lambda v: dict(v) if isinstance(v, Mapping) else v),
    ] = None
    format_options: Annotated[
        dict[str, Any] | None,
        SkipValidation,
        _must("a dict of the format's options or None", lambda v: v is None or isinstance(v, dict)),
        convert(
            lambda v: dict(v) if isinstance(v, Mapping) else v.model_dump() if isinstance(v, BaseModel) else v
        ),
    ] = None
    schema_sample_size: _Count0 = 1000
    include_metadata: _Flag = False
    csv_delimiter: Annotated[
        str, SkipValidation, _must("a single character", lambda v: isinstance(v, str) and len(v) == 1)
    ] = ","
    starting_offsets: Annotated[
        OffsetsInitializer, SkipValidation, convert(lambda v: OffsetsInitializer.of(v, "starting_offsets"))
    ] = OffsetsInitializer.earliest()
    stopping_offsets: Annotated[OffsetsInitializer | None, SkipValidation, convert(_stops)] = None
    group_id: Annotated[
        str | None, SkipValidation, _must("a non-empty string or None", lambda v: v is None or _is_text(v))
    ] = None
    commit_offsets_on_checkpoint: _Flag = True
    on_bad_record: Annotated[
        Literal["fail", "dead_letter"],
        SkipValidation,
        _must(f"one of {ON_BAD_RECORD}", lambda v: v in ON_BAD_RECORD),
    ] = "fail"
    max_record_bytes: Annotated[
        int,
        SkipValidation,
        _must(
            f"an integer in 1..{MAX_RECORD_BYTES_CAP} (bytes)",
            lambda v: is_count(1)(v) and v <= MAX_RECORD_BYTES_CAP,
        ),
    ] = DEFAULT_MAX_RECORD_BYTES
    event_time: Annotated[
        str | None,
        SkipValidation,
        _must("'kafka' (the message timestamp), a column name, or None", lambda v: v is None or _is_text(v)),
    ] = None
    max_out_of_orderness_ms: Annotated[int, SkipValidation, duration("KafkaSource", bare="ms", sign="non-negative")] = 0
    idle_timeout_s: _SecondsOrNone = None
    discovery_interval_s: _SecondsOrNone = 10.0
    fail_on_data_loss: _Flag = True
    consumer_config: Annotated[
        dict[str, Any],
        SkipValidation,
        _must("a dict of librdkafka settings", lambda v: isinstance(v, dict)),
        convert(lambda v: {} if v is None else dict(v) if isinstance(v, Mapping) else v),
    ] = Field(default_factory=dict)
    batch_size: _Count1 = 10_000
    poll_timeout_ms: Annotated[
        int,
        SkipValidation,
        _must("an integer in 0..50 (checkpoints wait for poll_next)", lambda v: isinstance(v, int) and 0 <= v <= 50),
        duration("KafkaSource", bare="ms", sign="non-negative"),
    ] = 20
    fetch_thread: _Flag = True
    max_prefetch_bytes: Annotated[
        int, SkipValidation, _must("an integer >= 4 MiB (4194304)", is_count(4 * 1024 * 1024))
    ] = 64 * 1024 * 1024
    request_timeout_s: Annotated[float, SkipValidation, duration("KafkaSource")] = 10.0
    broker_unavailable_timeout_s: _SecondsOrNone = DEFAULT_BROKER_UNAVAILABLE_TIMEOUT_S
    reader: Annotated[
        Literal["auto", "native", "python"], SkipValidation, _must(f"one of {READERS}", lambda v: v in READERS)
    ] = "auto"
    name: str = "kafka"

    @model_validator(mode="after")
    def _check(self) -> KafkaSourceOptions:
        if (self.topics is None) == (self.topic_pattern is None):
            raise ConfigError(
                "KafkaSource: give exactly one of topics (a name or list of names) or topic_pattern"
            )
        self._check_format()
        if (
            self.starting_offsets.kind == "committed"
            and self.group_id is None
            and "group.id" not in self.consumer_config
        ):
            raise ConfigError(
                "KafkaSource: starting_offsets='committed' needs group_id (the group to read from)"
            )
        check_consumer_config(
            self.consumer_config, self.group_id, self.consumer_conf("sluice-validate", bounded=False)
        )
        if self.reader == "native":  # refused now, in one line, where it cannot run
            from sluice.connectors.kafka.native_choice import choose_reader

            choose_reader(self)
        return self

    def _check_format(self) -> None:
        takes = self.named_format.takes if self.named_format is not None else frozenset()
        for option in ("schema_registry", "avro_schema", "format_options"):
            if getattr(self, option) is not None and option not in takes:
                raise ConfigError(
                    f"KafkaSource: {option} applies to format {format_names(option)} (got {self.format!r})"
                )
        if self.named_format is not None:
            self.named_format.check(self)
        elif self.value_schema is not None:
            raise ConfigError(
                "KafkaSource: schema applies to the named formats (a decoder given as format makes its own "
                "batches)"
            )

    def __repr_args__(self) -> Any:
        for key, value in super().__repr_args__():
            if key == "value_schema":
                yield "schema", value
            else:
                yield key, redact(value) if key == "consumer_config" else value

    # -- derived ---------------------------------------------------------------------------------------
    @property
    def named_format(self) -> Format | None:
        """The registry entry of ``format`` (None for a decoder given as format)."""
        return FORMATS[self.format] if isinstance(self.format, str) else None

    @property
    def format_name(self) -> str:
        """``format`` as messages name it: its name, or the decoder's class."""
        return self.format if isinstance(self.format, str) else type(self.format).__name__

    @property
    def pattern(self) -> re.Pattern[str]:
        """The compiled topic pattern (``topics`` as an alternation of literal names)."""
        if self.topic_pattern is not None:
            return re.compile(self.topic_pattern)
        return re.compile("|".join(re.escape(t) for t in self.topics or []))

    @property
    def bounded(self) -> bool:
        """Whether reads end (``stopping_offsets`` given)."""
        return self.stopping_offsets is not None

    @property
    def infers_schema(self) -> bool:
        """Whether the value schema is inferred from the data (json/csv without schema or registry)."""
        return self.named_format is not None and self.named_format.infers_schema(self)

    @property
    def output_schema(self) -> pa.Schema | None:
        """The schema of the emitted batches if known at build time (with the metadata columns)."""
        schema = self.named_format.output_schema(self) if self.named_format is not None else None
        if schema is None or not self.include_metadata:
            return schema
        return pa.schema([*schema, *METADATA_FIELDS])

    @property
    def side_outputs(self) -> tuple[str, ...]:
        """``("dead_letters",)`` with ``on_bad_record="dead_letter"``."""
        return (DEAD_LETTERS,) if self.on_bad_record == "dead_letter" else ()

    @property
    def event_time_from_messages(self) -> bool:
        """Whether event time is the message timestamp (``"kafka"``, or the raw format's ``timestamp``)."""
        return self.event_time == "kafka" or (self.format == "raw" and self.event_time == "timestamp")

    @property
    def needs_timestamps(self) -> bool:
        """Whether the fetch thread reads the message timestamps (raw format, metadata, event time)."""
        return self.format == "raw" or self.include_metadata or self.event_time_from_messages

    # -- librdkafka ------------------------------------------------------------------------------------
    def consumer_conf(self, default_group: str, *, bounded: bool, reader: bool = False) -> dict[str, Any]:
        """The full librdkafka configuration of a reader (``reader=True``: within the prefetch budget; it is
        told where each partition ends, bounded or not, to move its positions past trailing transaction
        markers) or the enumerator."""
        return consumer_conf(
            self.bootstrap_servers,
            self.group_id or default_group,
            self.consumer_config,
            partition_eof=bounded or reader,
            max_record_bytes=self.max_record_bytes,
            prefetch_bytes=self.max_prefetch_bytes if reader else None,
        )

    def admin_conf(self) -> dict[str, Any]:
        """librdkafka configuration of the enumerator's AdminClient (connection and security settings)."""
        return admin_conf(self.bootstrap_servers, self.consumer_config)
