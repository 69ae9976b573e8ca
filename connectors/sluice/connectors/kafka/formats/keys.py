"""Value decoders the change formats build on: JSON with Kafka Connect's ``schema``/``payload`` envelope
unwrapped, and message keys that are a JSON scalar or UTF-8 text."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
from sluice.connectors.kafka.formats.base import Decoded, ValueDecoder
from sluice.connectors.kafka.formats.json import JsonDecoder

__all__ = ["ConnectJsonDecoder", "ScalarJsonDecoder", "StringDecoder", "unwrap_connect"]


def unwrap_connect(values: list[bytes]) -> list[bytes]:
    """``values`` with each Kafka Connect JSON envelope (``{"schema": ..., "payload": ...}``, what
    ``JsonConverter`` writes with ``schemas.enable=true``) replaced by its payload.

    Only values holding ``"schema"`` are parsed (with Python's json); the rest pass as they are, and so
    does anything that is not exactly such an envelope (the batch parser then judges it).
    """
    out = values
    for i, v in enumerate(values):
        if b'"schema"' not in v:
            continue
        try:
            doc = json.loads(v)
        except ValueError:
            continue
        if isinstance(doc, dict) and doc.keys() == {"schema", "payload"} and doc["payload"] is not None:
            if out is values:
                out = list(values)
            out[i] = json.dumps(doc["payload"], separators=(",", ":")).encode()
    return out


class ConnectJsonDecoder(JsonDecoder):
    """JSON values with or without Kafka Connect's schema envelope: the ``schema`` part is dropped (so it
    never has to be typed) and the payload decoded as :class:`JsonDecoder` does."""

    def _decode(self, values: list[bytes]) -> Decoded:
        return super()._decode(unwrap_connect(values))


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
