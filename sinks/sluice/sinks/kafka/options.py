"""The options of :class:`~sluice.sinks.kafka.KafkaSink`: one frozen, validated model, and the librdkafka
settings it builds (secrets never shown: :func:`redact`)."""

from __future__ import annotations

import logging
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from sluice.config import _Frozen
from sluice.durations import to_seconds
from sluice.errors import ConfigError

__all__ = [
    "DELIVERIES",
    "FORMATS",
    "KafkaSinkOptions",
    "RegistryOptions",
    "is_secret",
    "redact",
    "redact_text",
]

DELIVERIES = ("exactly_once", "at_least_once", "none")
#: where librdkafka's log lines of the sink's clients go
LIBRDKAFKA_LOG = logging.getLogger("sluice.sinks.kafka.librdkafka")
FORMATS = ("json", "avro", "json_schema", "raw")
#: librdkafka settings the sink sets itself, with the option to use instead
RESERVED = {
    "bootstrap.servers": "bootstrap_servers",
    "transactional.id": "transactional_id_prefix",
    "enable.idempotence": "delivery",
}
_SECRET_MARKERS = (
    "password",
    "secret",
    "jaas",
    "key.pem",
    "private",
    "token",
    "credential",
    "oauthbearer.config",
)


def is_secret(key: str) -> bool:
    """Whether a librdkafka setting holds a secret (never logged, never shown in repr or errors)."""
    return any(m in key.lower() for m in _SECRET_MARKERS)


def redact(conf: dict[str, Any]) -> dict[str, Any]:
    """``conf`` with the values of secret settings replaced by ``***``."""
    return {k: "***" if is_secret(k) else v for k, v in conf.items()}


def redact_text(text: str, conf: dict[str, Any]) -> str:
    """``text`` with every secret value of ``conf`` replaced by ``***``."""
    for k, v in conf.items():
        if is_secret(k) and isinstance(v, str) and v:
            text = text.replace(v, "***")
    return text


class RegistryOptions(_Frozen):
    """A Confluent-compatible schema registry (``schema_registry`` of KafkaSink; the Kafka source's
    ``SchemaRegistry`` object or a URL is taken as well).

    Attributes:
        url: ``http(s)://host:port``.
        username: basic-auth user (Confluent Cloud: the API key).
        password: basic-auth password; never shown.
        timeout_s: bound on one HTTP request.
        ca_location: a CA bundle file for https (default: the system's).
    """

    url: str
    username: str | None = None
    password: SecretStr | None = Field(default=None, repr=False)
    timeout_s: float = 10.0
    ca_location: str | None = None

    @field_validator("timeout_s", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> float:
        return to_seconds(v, "KafkaSink: schema_registry timeout_s", sign="any")

    @model_validator(mode="after")
    def _check(self) -> RegistryOptions:
        from urllib.parse import urlsplit

        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.username:
            raise ConfigError(
                "KafkaSink: schema_registry url must be http(s)://host[:port] (credentials go in username and "
                "password)"
            )
        if not self.timeout_s > 0:
            raise ConfigError(f"KafkaSink: schema_registry timeout_s must be > 0 (got {self.timeout_s!r})")
        if (self.username is None) != (self.password is None):
            raise ConfigError("KafkaSink: schema_registry needs both username and password, or neither")
        return self


def _registry(value: Any) -> Any:
    if value is None or isinstance(value, RegistryOptions | dict):
        return value
    if isinstance(value, str):
        return {"url": value}
    if hasattr(value, "url"):  # the Kafka source's SchemaRegistry
        fields = ("url", "username", "password", "timeout_s", "ca_location")
        return {f: getattr(value, f) for f in fields if getattr(value, f, None) is not None}
    raise ConfigError(
        f"KafkaSink: schema_registry must be a URL, a dict or a SchemaRegistry (got {type(value).__name__})"
    )


class KafkaSinkOptions(_Frozen):
    """What a :class:`~sluice.sinks.kafka.KafkaSink` writes where, and how (see its docstring)."""

    bootstrap_servers: str
    topic: str
    delivery: Literal["exactly_once", "at_least_once", "none"] = "exactly_once"
    value_format: Literal["json", "avro", "json_schema", "raw"] = "json"
    value_columns: tuple[str, ...] | None = None
    value_schema: dict[str, Any] | str | None = None
    key_columns: tuple[str, ...] = ()
    key_format: Literal["json", "avro", "json_schema", "raw"] = "raw"
    key_schema: dict[str, Any] | str | None = None
    value_subject: str | None = None
    key_subject: str | None = None
    header_columns: tuple[str, ...] = ()
    headers: dict[str, str | bytes] = Field(default_factory=dict)
    partition_by: str | None = None
    timestamp_column: str | None = None
    schema_registry: RegistryOptions | None = None
    producer_config: dict[str, Any] = Field(default_factory=dict, repr=False)
    transactional_id_prefix: str | None = None
    marker_topic: str | None = None
    lineage_header: str | None = None
    transaction_timeout_s: float = 60.0

    @field_validator("transaction_timeout_s", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> float:
        return to_seconds(v, "KafkaSink: transaction_timeout_s", sign="any")

    @field_validator("key_columns", "header_columns", "value_columns", mode="before")
    @classmethod
    def _columns(cls, v: Any) -> Any:
        return (v,) if isinstance(v, str) else v

    @field_validator("schema_registry", mode="before")
    @classmethod
    def _coerce_registry(cls, v: Any) -> Any:
        return _registry(v)

    @model_validator(mode="after")
    def _check(self) -> KafkaSinkOptions:
        if not self.bootstrap_servers or not self.topic:
            raise ConfigError("KafkaSink: bootstrap_servers and topic must not be empty")
        for fmt, which in ((self.value_format, "value_format"), (self.key_format, "key_format")):
            if (
                fmt in ("avro", "json_schema")
                and self.schema_registry is None
                and (which == "value_format" or self.key_columns)
            ):
                raise ConfigError(
                    f"KafkaSink: {which} {fmt!r} writes the schema registry's wire format: give schema_registry "
                    "(a URL or a SchemaRegistry)"
                )
        if self.key_format == "raw" and len(self.key_columns) > 1:
            raise ConfigError(
                f"KafkaSink: key_format 'raw' takes one key column (got {list(self.key_columns)}): use key_format 'json'"
            )
        if self.value_format == "raw" and self.value_columns is not None and len(self.value_columns) != 1:
            raise ConfigError(
                f"KafkaSink: value_format 'raw' takes one value column (got {list(self.value_columns)})"
            )
        used = [*self.header_columns, *([self.partition_by] if self.partition_by else [])]
        if self.value_columns is not None and set(self.value_columns) & set(used):
            raise ConfigError(
                "KafkaSink: a column cannot be in value_columns and also a header or partition column"
            )
        for k in self.producer_config:
            if not isinstance(k, str):
                raise ConfigError(
                    f"KafkaSink: producer_config keys must be librdkafka setting names (got {k!r})"
                )
            if k in RESERVED:
                raise ConfigError(f"KafkaSink: producer_config must not set {k!r}: use {RESERVED[k]}")
        if not 0 < self.transaction_timeout_s <= 900:
            raise ConfigError(
                f"KafkaSink: transaction_timeout_s must be in (0, 900] seconds (got {self.transaction_timeout_s!r})"
            )
        for opt in ("transactional_id_prefix", "marker_topic", "lineage_header", "value_subject", "key_subject"):
            v = getattr(self, opt)
            if v is not None and (not v or len(v) > 200):
                raise ConfigError(f"KafkaSink: {opt} must be 1 to 200 characters (got {v!r})")
        return self

    def txn_prefix(self, job_id: str) -> str:
        """The start of the sink's transactional ids (and marker groups) in ``job_id``."""
        return self.transactional_id_prefix or f"sluice-{job_id}-{self.topic}"

    @property
    def marker(self) -> str:
        """The topic whose partition 0 carries the marker offsets."""
        return self.marker_topic or self.topic

    def client_settings(self, **extra: Any) -> dict[str, Any]:
        """Settings of the sink's admin clients and marker consumers: the connection (and security) settings
        of ``producer_config``, the brokers, librdkafka's log through Python logging."""
        conf = {k: v for k, v in self.producer_config.items() if k.startswith(("security.", "sasl.", "ssl."))}
        return {**conf, "bootstrap.servers": self.bootstrap_servers, "log_level": 3, "logger": LIBRDKAFKA_LOG, **extra}

    def producer_settings(self, transactional_id: str | None = None) -> dict[str, Any]:
        """librdkafka settings of a producer: defaults, the user's ``producer_config``, then the sink's own."""
        conf: dict[str, Any] = {
            "linger.ms": 20,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
            "partitioner": "murmur2_random",  # the Java client's: keys land where Java producers put them
            "log_level": 3,
            "logger": LIBRDKAFKA_LOG,
            **self.producer_config,
            "bootstrap.servers": self.bootstrap_servers,
        }
        if transactional_id is not None:
            conf["transactional.id"] = transactional_id
            conf.setdefault("transaction.timeout.ms", int(self.transaction_timeout_s * 1000))
        elif self.delivery == "at_least_once":
            conf["enable.idempotence"] = True
        return conf

    def check_producer_config(self) -> None:
        """librdkafka checks names and values when a client is made (no network): a ConfigError names it."""
        from confluent_kafka import KafkaException, Producer

        try:
            Producer({**self.producer_settings(), "bootstrap.servers": "", "log_level": 0}).flush(
                0
            )  # no network
        except (KafkaException, ValueError, TypeError) as exc:
            raise ConfigError(
                "KafkaSink: producer_config: " + redact_text(str(exc), self.producer_config)
            ) from None
