"""Confluent Schema Registry: the wire format's schema ids resolved over the registry's REST API.

A record in the Confluent wire format is ``0x00`` (magic byte), the schema id (4 bytes, big-endian), then the
payload (Avro binary or JSON text). Each id is fetched once (``GET /schemas/ids/{id}``) and cached for the
life of the process, shared by every reader of the same registry; an id the registry does not know is
remembered for ``_NEGATIVE_TTL_S`` so a stream of bad records does not become a stream of requests.

The standard library's HTTP client is enough for one GET per schema id; transient failures (connection
refused, timeouts, HTTP 5xx) are retried with tenacity, then fail the job with :class:`SchemaRegistryError`.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sluice.connectors.kafka.errors import SchemaNotFoundError, SchemaRegistryError
from sluice.errors import ConfigError
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

__all__ = ["RegisteredSchema", "SchemaRegistry", "SchemaRegistryClient", "client_for", "split_wire_format"]

_ACCEPT = "application/vnd.schemaregistry.v1+json, application/vnd.schemaregistry+json; q=0.9, application/json; q=0.5"
_NEGATIVE_TTL_S = 30.0
#: Confluent's error code for "schema not found"
_NOT_FOUND = 40403


@dataclass(frozen=True)
class SchemaRegistry:
    """Where the schema registry is and how to log in (the ``schema_registry`` option of KafkaSource).

    Args:
        url: ``http(s)://host:port`` of a Confluent-compatible registry (Confluent, Karapace, Redpanda,
            Apicurio's ccompat API).
        username: basic-auth user (Confluent Cloud: the API key).
        password: basic-auth password (API secret); never shown in repr, logs or errors.
        timeout_s: bound on one HTTP request.
        ca_location: a CA bundle file for https (default: the system's).
    """

    url: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    timeout_s: float = 10.0
    ca_location: str | None = None

    @classmethod
    def of(cls, value: object) -> SchemaRegistry:
        """Coerce the option's value (a URL or a SchemaRegistry); credentials in the URL move to the fields."""
        if isinstance(value, SchemaRegistry):
            conf = value
        elif isinstance(value, str):
            parts = urllib.parse.urlsplit(value)
            if parts.username is not None:
                netloc = parts.hostname or ""
                if parts.port is not None:
                    netloc += f":{parts.port}"
                conf = cls(
                    urllib.parse.urlunsplit(parts._replace(netloc=netloc)),
                    urllib.parse.unquote(parts.username),
                    urllib.parse.unquote(parts.password or ""),
                )
            else:
                conf = cls(value)
        else:
            raise ConfigError(
                f"KafkaSource: schema_registry must be a URL string or a SchemaRegistry (got {type(value).__name__})"
            )
        conf.check()
        return conf

    def check(self) -> None:
        """Raise ConfigError if the URL or a setting is unusable."""
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(
                f"KafkaSource: schema_registry url must be http(s)://host[:port] (got {self.url!r})"
            )
        if not isinstance(self.timeout_s, int | float) or self.timeout_s <= 0:
            raise ConfigError(f"KafkaSource: schema_registry timeout_s must be > 0 (got {self.timeout_s!r})")
        if (self.username is None) != (self.password is None):
            raise ConfigError("KafkaSource: schema_registry needs both username and password, or neither")


@dataclass(frozen=True)
class RegisteredSchema:
    """One schema of the registry.

    Attributes:
        schema_id: the global id.
        schema_type: ``"AVRO"``, ``"JSON"`` or ``"PROTOBUF"`` (the registry omits it for Avro).
        schema: the schema text.
        references: the references to schemas of other subjects, as the registry lists them.
    """

    schema_id: int
    schema_type: str
    schema: str
    references: tuple[dict[str, Any], ...] = ()


class _TransientError(SchemaRegistryError):
    """A failure worth retrying (connection refused, timeout, HTTP 5xx); never leaves this module."""


class SchemaRegistryClient:
    """Fetches schemas by id and caches them; thread-safe. Use :func:`client_for` to share one per registry."""

    def __init__(self, conf: SchemaRegistry) -> None:
        self.conf = conf
        self._base = conf.url.rstrip("/")
        self._cache: dict[int, RegisteredSchema] = {}
        self._missing: dict[int, float] = {}
        self._lock = threading.Lock()
        self._headers = {"Accept": _ACCEPT, "User-Agent": "sluice-kafka"}
        if conf.username is not None:
            token = base64.b64encode(f"{conf.username}:{conf.password}".encode()).decode()
            self._headers["Authorization"] = f"Basic {token}"
        self._ssl = (
            ssl.create_default_context(cafile=conf.ca_location) if conf.url.startswith("https") else None
        )
        #: HTTP requests made (for tests and metrics)
        self.requests = 0

    def schema(self, schema_id: int) -> RegisteredSchema:
        """The schema with ``schema_id``; raises SchemaNotFoundError or SchemaRegistryError."""
        found = self._cache.get(schema_id)
        if found is not None:
            return found
        with self._lock:  # one fetch per id even when several readers miss at once
            found = self._cache.get(schema_id)
            if found is not None:
                return found
            missed = self._missing.get(schema_id)
            if missed is not None and time.monotonic() - missed < _NEGATIVE_TTL_S:
                raise SchemaNotFoundError(self._base, schema_id)
            try:
                found = self._fetch(schema_id)
            except SchemaNotFoundError:
                self._missing[schema_id] = time.monotonic()
                raise
            self._cache[schema_id] = found
            return found

    def _fetch(self, schema_id: int) -> RegisteredSchema:
        try:
            body = self._get_with_retries(f"/schemas/ids/{schema_id}")
        except _TransientError as exc:
            raise SchemaRegistryError(
                f"cannot reach the schema registry at {self._base!r} (after retries): {exc}. "
                "Check the schema_registry url and that the registry is running."
            ) from None
        if body is None:
            raise SchemaNotFoundError(self._base, schema_id)
        if not isinstance(body, dict) or not isinstance(body.get("schema"), str):
            raise SchemaRegistryError(
                f"the schema registry at {self._base!r} answered GET /schemas/ids/{schema_id} with "
                f"{str(body)[:200]!r}, not a schema: is the url the registry's?"
            )
        return RegisteredSchema(
            schema_id,
            str(body.get("schemaType") or "AVRO").upper(),
            body["schema"],
            tuple(body.get("references") or ()),
        )

    def _get_with_retries(self, path: str) -> Any:
        retrying = retry(
            retry=retry_if_exception_type(_TransientError),
            stop=stop_after_attempt(4),
            wait=wait_exponential(multiplier=0.1, max=2.0),
            reraise=True,
        )
        return retrying(self._get)(path)

    def _get(self, path: str) -> Any:
        """The decoded JSON body; None for a "not found" answer."""
        self.requests += 1
        req = urllib.request.Request(self._base + path, headers=self._headers)
        try:
            with urllib.request.urlopen(req, timeout=self.conf.timeout_s, context=self._ssl) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            code = _error_code(exc)
            if exc.code == 404 and code in (_NOT_FOUND, None):
                return None
            if exc.code in (401, 403):
                raise SchemaRegistryError(
                    f"the schema registry at {self._base!r} refused the request (HTTP {exc.code}): check "
                    "the schema_registry username and password"
                ) from None
            if exc.code >= 500 or exc.code == 429:
                raise _TransientError(f"HTTP {exc.code} {exc.reason}") from None
            raise SchemaRegistryError(
                f"the schema registry at {self._base!r} answered GET {path} with HTTP {exc.code} "
                f"(error_code {code})"
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            raise _TransientError(str(getattr(exc, "reason", exc))) from None
        except ValueError as exc:
            raise SchemaRegistryError(
                f"the schema registry at {self._base!r} answered GET {path} with invalid JSON ({exc})"
            ) from None


def _error_code(exc: urllib.error.HTTPError) -> int | None:
    try:
        body = json.loads(exc.read() or b"{}")
    except (ValueError, OSError):
        return None
    code = body.get("error_code") if isinstance(body, dict) else None
    return code if isinstance(code, int) else None


_CLIENTS: dict[SchemaRegistry, SchemaRegistryClient] = {}
_CLIENTS_LOCK = threading.Lock()


def client_for(conf: SchemaRegistry) -> SchemaRegistryClient:
    """The process-wide client of ``conf`` (so every reader in a process shares one schema cache)."""
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(conf)
        if client is None:
            client = _CLIENTS[conf] = SchemaRegistryClient(conf)
        return client


def split_wire_format(values: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """Schema id of every value in the Confluent wire format, vectorized over the batch.

    Returns:
        ``(ids, ok)``: int64 schema ids, and a mask of the values that have the magic byte and a full id
        (the payload of value ``i`` is ``values[i][5:]``).
    """
    lens = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
    buf = np.frombuffer(b"".join(values), dtype=np.uint8)
    starts = np.zeros(len(values), dtype=np.int64)
    np.cumsum(lens[:-1], out=starts[1:])
    ok = lens >= 5
    ids = np.full(len(values), -1, dtype=np.int64)
    s = starts[ok]
    if s.size:
        magic = buf[s]
        word = (
            (buf[s + 1].astype(np.int64) << 24)
            | (buf[s + 2].astype(np.int64) << 16)
            | (buf[s + 3].astype(np.int64) << 8)
            | buf[s + 4].astype(np.int64)
        )
        ids[ok] = np.where(magic == 0, word, -1)
        ok[ok] = magic == 0
    return ids, ok
