"""librdkafka settings of the Kafka source: defaults, reserved keys and secret redaction."""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Mapping
from typing import Any

from sluice.errors import ConfigError

__all__ = [
    "DEFAULT_BROKER_UNAVAILABLE_TIMEOUT_S",
    "DEFAULT_MAX_RECORD_BYTES",
    "FILE_SETTINGS",
    "LIBRDKAFKA_LOG",
    "MAX_RECORD_BYTES_CAP",
    "RESERVED",
    "TUNING",
    "admin_conf",
    "check_consumer_config",
    "check_files",
    "consumer_conf",
    "is_secret",
    "receive_max_bytes",
    "redact",
    "redact_text",
]

#: Kafka's default ``message.max.bytes`` (1 MiB): the largest value decoded unless ``max_record_bytes`` says
DEFAULT_MAX_RECORD_BYTES = 1024 * 1024
#: what librdkafka can receive at most (``receive.message.max.bytes`` is capped at 2^31 - 1), less a margin
MAX_RECORD_BYTES_CAP = 1024 * 1024 * 1024
#: how long a reader waits for an unreachable broker before failing over to a restart: longer than a
#: broker's rolling restart or a network blip, short enough that a supervisor learns of a lasting outage
#: (once the restarts are spent) within minutes; Kafka's max.poll.interval.ms has the same default
DEFAULT_BROKER_UNAVAILABLE_TIMEOUT_S = 300.0
_RECEIVE_MAX_DEFAULT = 100_000_000  # librdkafka's receive.message.max.bytes


def receive_max_bytes(max_record_bytes: int, conf: Mapping[str, Any]) -> int:
    """librdkafka's ``receive.message.max.bytes`` for a consumer whose fetch responses must hold one record
    of ``max_record_bytes`` (and at least ``fetch.max.bytes`` + 512, which librdkafka requires)."""
    try:
        fetch = int(conf["fetch.max.bytes"])
    except (TypeError, ValueError):  # a wrong value: librdkafka names it when the client is created
        fetch = int(TUNING["fetch.max.bytes"])
    needed = max_record_bytes + fetch + 1024 * 1024
    return max(_RECEIVE_MAX_DEFAULT, min(needed, 2**31 - 1))

#: fetch/queue tuning (overridable through ``consumer_config``): fetch large batches and keep a prefetch
#: queue, so the reader never waits on the network while it decodes (librdkafka's defaults pause fetching
#: at 100k queued messages per partition and 1 MB per partition fetch). A reader's queue is capped by its
#: ``max_prefetch_bytes``; when the queue is full librdkafka postpones the partition's next fetch by
#: ``fetch.queue.backoff.ms`` (default 1 s, which starves a reader whose queue is small): 10 ms here.
TUNING: dict[str, Any] = {
    "fetch.max.bytes": 64 * 1024 * 1024,
    "max.partition.fetch.bytes": 16 * 1024 * 1024,
    "queued.max.messages.kbytes": 256 * 1024,
    "queued.min.messages": 1_000_000,
    "fetch.wait.max.ms": 100,
    "fetch.queue.backoff.ms": 10,
    "isolation.level": "read_committed",
    "socket.keepalive.enable": True,
}

#: keys the source sets itself, with the option to use instead
RESERVED: dict[str, str] = {
    "bootstrap.servers": "bootstrap_servers",
    "enable.auto.commit": "commit_offsets_on_checkpoint (offsets live in checkpoints)",
    "enable.auto.offset.store": "commit_offsets_on_checkpoint (offsets live in checkpoints)",
    "auto.offset.reset": "fail_on_data_loss / starting_offsets",
    "enable.partition.eof": "stopping_offsets (the source's readers always set it)",
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

#: librdkafka settings that name a file (certificates, keys, keytabs); ``ssl.ca.location`` may also be
#: ``probe`` (find the system's CA bundle)
FILE_SETTINGS = (
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.keystore.location",
    "ssl.crl.location",
    "sasl.kerberos.keytab",
)


def check_files(conf: Mapping[str, Any]) -> None:
    """Refuse a file setting whose file does not exist, naming the setting and the path (librdkafka's own
    message for it is an OpenSSL error code)."""
    for key in FILE_SETTINGS:
        path = conf.get(key)
        if isinstance(path, str) and path and path != "probe" and not os.path.exists(path):
            raise ConfigError(f"KafkaSource: consumer_config[{key!r}]: no such file {path!r}")


class _OncePerMessage(logging.Filter):
    """Passes each distinct librdkafka line once per ``window`` seconds.

    An unreachable broker makes every client thread log the same refused connection at each reconnect
    (hundreds of lines a minute); one line says it all. Client and thread names and millisecond figures
    are ignored when lines are compared.
    """

    _VARYING = re.compile(r"rdkafka#\w+-\d+|\d+ms|\d+/\d+")

    def __init__(self, window: float = 60.0) -> None:
        super().__init__()
        self.window = window
        self._last: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = self._VARYING.sub("", record.getMessage())
        now = time.monotonic()
        if now - self._last.get(key, -self.window) < self.window:
            return False
        if len(self._last) > 1000:
            self._last.clear()
        self._last[key] = now
        return True


#: where librdkafka's own log lines go (each distinct line once a minute)
LIBRDKAFKA_LOG = logging.getLogger("sluice.kafka.librdkafka")
LIBRDKAFKA_LOG.addFilter(_OncePerMessage())


def is_secret(key: str) -> bool:
    """Whether a librdkafka setting holds a secret (never logged, never shown in repr or errors)."""
    k = key.lower()
    return any(m in k for m in _SECRET_MARKERS)


def redact(conf: Mapping[str, Any]) -> dict[str, Any]:
    """``conf`` with the values of secret settings replaced by ``***``."""
    return {k: "***" if is_secret(k) else v for k, v in conf.items()}


def redact_text(text: str, conf: Mapping[str, Any]) -> str:
    """``text`` with every secret value of ``conf`` replaced by ``***`` (for error messages)."""
    for k, v in conf.items():
        if is_secret(k) and isinstance(v, str) and v:
            text = text.replace(v, "***")
    return text


def check_consumer_config(conf: Mapping[str, Any], group_id: str | None, full: Mapping[str, Any]) -> None:
    """Refuse reserved or misspelled librdkafka settings, missing files and bad values in the source's
    ``consumer_config`` (``conf``); ``full`` is the configuration a client would get (librdkafka checks
    names and values when a client is created, no network needed)."""
    from confluent_kafka import Consumer, KafkaException

    for key in conf:
        if not isinstance(key, str):
            raise ConfigError(f"KafkaSource: consumer_config keys must be librdkafka setting names (got {key!r})")
        if key in RESERVED:
            raise ConfigError(f"KafkaSource: consumer_config must not set {key!r}: use {RESERVED[key]}")
    if group_id is not None and "group.id" in conf:
        raise ConfigError("KafkaSource: give group_id or consumer_config['group.id'], not both")
    check_files(conf)
    try:
        Consumer(dict(full)).close()
    except (KafkaException, ValueError, TypeError) as exc:
        raise ConfigError("KafkaSource: consumer_config: " + redact_text(str(exc), conf)) from None


def consumer_conf(
    bootstrap_servers: str,
    group: str,
    settings: Mapping[str, Any],
    *,
    partition_eof: bool,
    max_record_bytes: int,
    prefetch_bytes: int | None = None,
) -> dict[str, Any]:
    """The full librdkafka configuration of a consumer of the source: ``settings`` (the source's
    ``consumer_config``) over :data:`TUNING` over what the source owns; ``prefetch_bytes`` (a reader's
    ``max_prefetch_bytes``) sizes librdkafka's queue to half of it; ``partition_eof``: the consumer reports
    the end of each partition (readers and bounded reads need it)."""
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap_servers,
        "group.id": group,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",
        "enable.partition.eof": partition_eof,
        **TUNING,
        **settings,
    }
    if prefetch_bytes is not None:  # librdkafka's queue is the other half of the prefetch budget
        half = prefetch_bytes // 2
        if "queued.max.messages.kbytes" not in settings:
            conf["queued.max.messages.kbytes"] = max(1, half // 1024)
        if "fetch.max.bytes" not in settings:
            conf["fetch.max.bytes"] = min(int(conf["fetch.max.bytes"]), half)
        if "max.partition.fetch.bytes" not in settings:
            conf["max.partition.fetch.bytes"] = min(
                int(conf["max.partition.fetch.bytes"]), int(conf["fetch.max.bytes"])
            )
    if "receive.message.max.bytes" not in settings:
        conf["receive.message.max.bytes"] = receive_max_bytes(max_record_bytes, conf)
    conf.setdefault("logger", LIBRDKAFKA_LOG)
    return conf


def admin_conf(bootstrap_servers: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """librdkafka configuration of the enumerator's AdminClient (connection and security settings)."""
    skip = set(TUNING) | {"group.id", "isolation.level"}
    conf = {k: v for k, v in settings.items() if k not in skip}
    conf["bootstrap.servers"] = bootstrap_servers
    conf.setdefault("logger", LIBRDKAFKA_LOG)
    return conf
