"""Schemas for the registry's wire format: Arrow schemas as Avro or JSON Schema, and their registration.

A value in the Confluent wire format is ``0x00``, the schema id (4 bytes, big-endian), then the payload
(Avro binary or JSON text). The sink registers its schema under the subject ``<topic>-value`` (or ``-key``:
the registry's TopicNameStrategy; the options ``value_subject`` / ``key_subject`` name another) with
``POST /subjects/{subject}/versions``, which returns the id of the schema (the existing one if the subject
already has it); ids are cached for the life of the process. A registry that refuses the schema (HTTP 409:
incompatible with the subject's earlier schemas) fails the job at once with its message; transient failures
(connection refused, timeouts, HTTP 5xx) are retried.
"""

from __future__ import annotations

import base64
import json
import ssl
import struct
import threading
import urllib.error
import urllib.request
from typing import Any

import pyarrow as pa
from sluice.errors import ConfigError, SluiceError
from sluice.sinks.kafka.options import RegistryOptions
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

__all__ = ["SchemaRegistryError", "avro_schema", "json_schema", "register", "wire_prefix"]


class SchemaRegistryError(SluiceError):
    """The schema registry could not be reached, or refused the sink's schema (``recoverable`` then False)."""


class _Transient(SchemaRegistryError):
    """Worth a retry (connection refused, timeout, HTTP 5xx or 429); never leaves this module."""


def wire_prefix(schema_id: int) -> bytes:
    """The 5 bytes before a payload in the registry's wire format."""
    return struct.pack(">bI", 0, schema_id)


_AVRO: dict[str, Any] = {"bool": "boolean", "int8": "int", "int16": "int", "int32": "int", "uint8": "int",
                         "uint16": "int", "int64": "long", "uint32": "long", "float": "float", "double": "double",
                         "string": "string", "large_string": "string", "binary": "bytes", "large_binary": "bytes"}  # fmt: skip


def _avro_type(name: str, t: pa.DataType) -> Any:
    if str(t) in _AVRO:
        return _AVRO[str(t)]
    if pa.types.is_timestamp(t):
        return {
            "type": "long",
            "logicalType": "timestamp-millis" if t.unit in ("s", "ms") else "timestamp-micros",
        }
    if pa.types.is_date(t):
        return {"type": "int", "logicalType": "date"}
    if pa.types.is_decimal(t):
        return {"type": "bytes", "logicalType": "decimal", "precision": t.precision, "scale": t.scale}
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return {"type": "array", "items": _nullable(f"{name}_item", t.value_type)}
    if pa.types.is_struct(t):
        return {
            "type": "record",
            "name": name,
            "fields": [_avro_field(t.field(i)) for i in range(t.num_fields)],
        }
    raise ConfigError(f"KafkaSink: column {name!r} has type {t}, which has no Avro form: give value_schema")


def _nullable(name: str, t: pa.DataType) -> Any:
    return ["null", _avro_type(name, t)]


def _avro_field(f: pa.Field) -> dict[str, Any]:
    if f.nullable:
        return {"name": f.name, "type": _nullable(f.name, f.type), "default": None}
    return {"name": f.name, "type": _avro_type(f.name, f.type)}


def avro_schema(schema: pa.Schema, name: str) -> dict[str, Any]:
    """An Avro record schema for rows of ``schema`` (nullable columns as unions with null)."""
    return {"type": "record", "name": name, "namespace": "sluice", "fields": [_avro_field(f) for f in schema]}


def _json_type(t: pa.DataType) -> dict[str, Any]:
    if pa.types.is_boolean(t):
        return {"type": "boolean"}
    if pa.types.is_integer(t):
        return {"type": "integer"}
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        return {"type": "number"}
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return {"type": "array", "items": _json_type(t.value_type)}
    if pa.types.is_struct(t):
        return {
            "type": "object",
            "properties": {t.field(i).name: _json_type(t.field(i).type) for i in range(t.num_fields)},
        }
    return {"type": "string"}


def json_schema(schema: pa.Schema, title: str) -> dict[str, Any]:
    """A JSON Schema (draft-07) for rows of ``schema`` as the sink writes them."""
    props = {}
    for f in schema:
        t = _json_type(f.type)
        props[f.name] = {"oneOf": [{"type": "null"}, t]} if f.nullable else t
    return {"$schema": "http://json-schema.org/draft-07/schema#", "title": title, "type": "object",
            "properties": props}  # fmt: skip


_IDS: dict[tuple[str, str, str], int] = {}
_LOCK = threading.Lock()


def register(conf: RegistryOptions, subject: str, schema: str, schema_type: str) -> int:
    """The registry's id of ``schema`` (text) under ``subject``, registering it if needed (cached)."""
    cache_key = (conf.url, subject, schema)
    with _LOCK:
        if cache_key in _IDS:
            return _IDS[cache_key]
    body: dict[str, Any] = {"schema": schema}
    if schema_type != "AVRO":
        body = {"schemaType": schema_type, **body}
    try:
        answer = _post_with_retries(conf, f"/subjects/{subject}/versions", body)
    except _Transient as exc:
        raise SchemaRegistryError(
            f"KafkaSink: cannot reach the schema registry at {conf.url!r} (after retries): {exc}"
        ) from None
    schema_id = int(answer["id"])
    with _LOCK:
        _IDS[cache_key] = schema_id
    return schema_id


def _post_with_retries(conf: RegistryOptions, path: str, body: dict[str, Any]) -> Any:
    retrying = retry(
        retry=retry_if_exception_type(_Transient),
        stop=stop_after_attempt(4),
        wait=wait_exponential(multiplier=0.1, max=2.0),
        reraise=True,
    )
    return retrying(_post)(conf, path, body)


def _post(conf: RegistryOptions, path: str, body: dict[str, Any]) -> Any:
    headers = {"Content-Type": "application/vnd.schemaregistry.v1+json", "User-Agent": "sluice-kafka-sink"}
    if conf.username is not None and conf.password is not None:
        token = base64.b64encode(f"{conf.username}:{conf.password.get_secret_value()}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    context = ssl.create_default_context(cafile=conf.ca_location) if conf.url.startswith("https") else None
    req = urllib.request.Request(
        conf.url.rstrip("/") + path, data=json.dumps(body).encode(), headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=conf.timeout_s, context=context) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        if exc.code >= 500 or exc.code == 429:
            raise _Transient(f"HTTP {exc.code} {exc.reason}") from None
        try:
            message = json.loads(exc.read() or b"{}").get("message", "")
        except (ValueError, OSError, AttributeError):
            message = ""
        hint = " (check the schema_registry username and password)" if exc.code in (401, 403) else ""
        raise SchemaRegistryError(
            f"KafkaSink: the schema registry at {conf.url!r} refused POST {path} (HTTP {exc.code}){hint}: {message}",
            recoverable=False,
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        raise _Transient(str(getattr(exc, "reason", exc))) from None
    except ValueError as exc:
        raise SchemaRegistryError(
            f"KafkaSink: the schema registry at {conf.url!r} answered with invalid JSON ({exc})"
        ) from None
