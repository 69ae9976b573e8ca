"""The versioned serializer contract (Flink's ``SimpleVersionedSerializer``), pickle and JSON serializers,
and the JSON helpers for plain data and Arrow schemas."""

from __future__ import annotations

import base64
import json
import pickle
from abc import ABC, abstractmethod
from typing import Any, Generic, TypeVar

import pyarrow as pa

from sluice.serializers.plain import decode as decode_plain
from sluice.serializers.plain import encode as encode_plain

__all__ = [
    "JsonSerializer",
    "PickleSerializer",
    "SimpleVersionedSerializer",
    "from_json_value",
    "schema_from_text",
    "schema_to_text",
    "to_json_value",
]

T = TypeVar("T")


class SimpleVersionedSerializer(ABC, Generic[T]):
    """Turns values of one kind into bytes and back, with a format version.

    ``deserialize(version, serialize(x))`` must give back a value equal in behaviour to ``x`` (the
    conformance kit checks it); ``deserialize`` must accept every version this serializer ever wrote, or
    raise a clear error for one it cannot read.
    """

    @property
    @abstractmethod
    def version(self) -> int:
        """The format version :meth:`serialize` writes (stored with the bytes)."""

    @abstractmethod
    def serialize(self, obj: T) -> bytes:
        """``obj`` as bytes."""

    @abstractmethod
    def deserialize(self, version: int, data: bytes) -> T:
        """The value ``data`` holds, written by a serializer of format ``version``."""


class PickleSerializer(SimpleVersionedSerializer[Any]):
    """The default for connectors that name no serializer: pickle, version 1.

    Pickle runs code while it loads: the checkpoint format only ever unpickles what the job's checkpoint key
    signed (docs/security.md). Prefer a :class:`JsonSerializer`: it is safe without a key, readable, and
    survives a refactoring of the classes it stores.
    """

    @property
    def version(self) -> int:
        return 1

    def serialize(self, obj: Any) -> bytes:
        return pickle.dumps(obj, protocol=5)

    def deserialize(self, version: int, data: bytes) -> Any:
        if version != 1:
            raise ValueError(f"PickleSerializer reads version 1, not {version}")
        return pickle.loads(data)


class JsonSerializer(SimpleVersionedSerializer[T]):
    """A serializer whose bytes are JSON: subclass it with :meth:`to_json` and :meth:`from_json`.

    The JSON is strict (no NaN). Use :func:`to_json_value` / :func:`from_json_value` for values JSON cannot
    hold as they are (bytes, tuples, dates, decimals, dicts with non-string keys).
    """

    #: the format version written; bump it when :meth:`to_json` changes, and keep reading the old ones
    VERSION = 1

    @property
    def version(self) -> int:
        return self.VERSION

    @abstractmethod
    def to_json(self, obj: T) -> Any:
        """``obj`` as JSON-ready data (dicts, lists, strings, numbers, booleans, None)."""

    @abstractmethod
    def from_json(self, version: int, value: Any) -> T:
        """Inverse of :meth:`to_json` for data written at format ``version``."""

    def serialize(self, obj: T) -> bytes:
        return json.dumps(self.to_json(obj), separators=(",", ":"), allow_nan=False).encode()

    def deserialize(self, version: int, data: bytes) -> T:
        if not 1 <= version <= self.VERSION:
            raise ValueError(
                f"{type(self).__name__} reads versions 1..{self.VERSION}, not {version} (written by a newer "
                "version of the connector?)"
            )
        return self.from_json(version, json.loads(data))


def to_json_value(value: Any) -> Any:
    """Plain data (None, bool, int, float, str, bytes, list, tuple, dict, date, datetime, time, Decimal,
    UUID) as JSON-ready data; anything else raises TypeError. Inverse: :func:`from_json_value`."""
    return encode_plain(value)


def from_json_value(value: Any) -> Any:
    """Inverse of :func:`to_json_value` (strict: ValueError on data it did not write)."""
    return decode_plain(value)


def schema_to_text(schema: pa.Schema | None) -> str | None:
    """An Arrow schema as text for JSON (base64 of its IPC serialization), or None."""
    return None if schema is None else base64.b64encode(schema.serialize().to_pybytes()).decode()


def schema_from_text(text: str | None) -> pa.Schema | None:
    """Inverse of :func:`schema_to_text`."""
    return None if text is None else pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text, validate=True)))
