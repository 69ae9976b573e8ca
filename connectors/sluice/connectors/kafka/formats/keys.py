"""Value decoders the change formats build on: JSON with Kafka Connect's ``schema``/``payload`` envelope
unwrapped, and message keys that are a JSON scalar or UTF-8 text."""

from __future__ import annotations

import json
import re

import numpy as np
import pyarrow as pa
from sluice.connectors.kafka.formats.base import Decoded, ValueDecoder
from sluice.connectors.kafka.formats.json import JsonDecoder

__all__ = ["ConnectJsonDecoder", "ConnectUnwrapper", "ScalarJsonDecoder", "StringDecoder"]


_HEAD = re.compile(rb'\s*\{\s*"schema"\s*:')
_HEAD_TEXT = re.compile(r'\s*\{\s*"schema"\s*:\s*')
_PAYLOAD = re.compile(r'\s*,\s*"payload"\s*:')
_DECODER = json.JSONDecoder()


class ConnectUnwrapper:
    """Replaces each Kafka Connect JSON envelope (``{"schema": ..., "payload": ...}``, what ``JsonConverter``
    writes with ``schemas.enable=true``) by its payload's bytes, as they are.

    The schema part is the same for every record of one table version: the bytes up to the payload are
    remembered, so a record that starts with them is cut with a prefix test; only the first record of a new
    schema part is parsed (with Python's json: the schema must be an object with a ``type``, and nothing
    may follow the payload). A value that is not such an envelope passes as it is (the batch parser then
    judges it).
    """

    def __init__(self) -> None:
        self._prefix: bytes | None = None

    def __call__(self, values: list[bytes]) -> list[bytes]:
        out = values
        for i, v in enumerate(values):
            prefix = self._prefix
            if prefix is None or not v.startswith(prefix):
                if not _HEAD.match(v) or (prefix := self._learn(v)) is None:
                    continue
            rest = v[len(prefix) :].rstrip()
            if not rest.endswith(b"}"):
                continue
            if out is values:
                out = list(values)
            out[i] = rest[:-1].strip()
        return out

    def _learn(self, value: bytes) -> bytes | None:
        """The bytes of ``value`` up to its payload (remembered), None if it is not an envelope."""
        try:
            text = value.decode("utf-8")
            head = _HEAD_TEXT.match(text)
            if head is None:
                return None
            schema, end = _DECODER.raw_decode(text, head.end())
            payload = _PAYLOAD.match(text, end)
            if not isinstance(schema, dict) or "type" not in schema or payload is None:
                return None  # a Connect schema is an object with a type
            start = len(text) - len(text[payload.end() :].lstrip())
            _, end = _DECODER.raw_decode(text, start)
        except (UnicodeDecodeError, ValueError):
            return None
        if text[end:].strip() != "}":  # exactly schema and payload
            return None
        self._prefix = text[: payload.end()].encode()
        return self._prefix


class ConnectJsonDecoder(JsonDecoder):
    """JSON values with or without Kafka Connect's schema envelope: the ``schema`` part is dropped (so it
    never has to be typed) and the payload decoded as :class:`JsonDecoder` does."""

    def __init__(self, schema: pa.Schema | None, *, explicit: bool | None = None) -> None:
        super().__init__(schema, explicit=explicit)
        self._unwrap = ConnectUnwrapper()

    def _decode(self, values: list[bytes]) -> Decoded:
        return super()._decode(self._unwrap(values))


class ScalarJsonDecoder(ValueDecoder):
    """JSON scalars (``42``, ``"a"``) as one column ``name`` (each value wrapped as ``{"<name>": value}``)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._inner = JsonDecoder(None)
        self.schema = None

    def _decode(self, values: list[bytes]) -> Decoded:
        head = b'{"' + json.dumps(self.name)[1:-1].encode() + b'":'
        d = self._inner.decode([head + v + b"}" for v in values])
        self.schema = self._inner.schema
        return d


class StringDecoder(ValueDecoder):
    """UTF-8 text as one string column ``name``; values that are not UTF-8 are bad records."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.schema = pa.schema([(name, pa.string())])

    def _decode(self, values: list[bytes]) -> Decoded:
        raw = pa.array(values, pa.binary())
        try:
            return Decoded(pa.RecordBatch.from_arrays([raw.cast(pa.string())], schema=self.schema))
        except pa.ArrowInvalid:
            pass
        good: list[int] = []
        bad: list[tuple[int, str]] = []
        for i, v in enumerate(values):
            try:
                v.decode("utf-8")
                good.append(i)
            except UnicodeDecodeError as exc:
                bad.append((i, f"not UTF-8 text: {exc}"))
        col = raw.take(pa.array(good, pa.int64())).cast(pa.string())
        batch = pa.RecordBatch.from_arrays([col], schema=self.schema)
        return Decoded(batch, np.asarray(good, dtype=np.int64), bad)
