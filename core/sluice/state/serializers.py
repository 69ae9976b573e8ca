"""State value serializers: how a state's values become bytes in RocksDB, checkpoints and savepoints.

A state descriptor names its serializer (``serializer="int64"``, a ``pyarrow.DataType``, or a
:class:`StateSerializer`); without one, values are pickled (:class:`PickleStateSerializer`), which only ever
happens inside files the job's checkpoint key authenticates. Primitives use fixed struct encodings
(int64, float64 and timestamps as 8 big-endian bytes, bool as one byte, strings as UTF-8, binary as is), a
struct is a row encoding of its fields. Batch-wise state access (``encode_array`` / ``decode_array``) works
on whole Arrow arrays and needs a serializer with an Arrow type.

A serializer's :attr:`~StateSerializer.id` is stored with the state; restoring a state under another
serializer is refused.
"""

from __future__ import annotations

import datetime
import operator
import pickle
import struct
from abc import ABC, abstractmethod
from collections.abc import Sequence
from itertools import pairwise, repeat
from typing import Any, cast

import numpy as np
import pyarrow as pa

from sluice.errors import ConfigError
from sluice.state.keycodec import rows_as_bytes

__all__ = [
    "ArrowIpcSerializer",
    "PickleStateSerializer",
    "PrimitiveSerializer",
    "StateSerializer",
    "StructSerializer",
    "serializer_for",
]


class StateSerializer(ABC):
    """Turns one kind of state value into bytes and back.

    Attributes:
        id: identifies the encoding; stored with the state and compared on restore.
        arrow_type: the Arrow type of the values for batch-wise access, or None (per-key access only).
    """

    id: str
    arrow_type: pa.DataType | None = None
    #: the bytes of every encoded value, if they all have one width (else None)
    width: int | None = None

    @abstractmethod
    def encode(self, value: Any) -> bytes:
        """One value as bytes."""

    @abstractmethod
    def decode(self, data: bytes) -> Any:
        """The value ``data`` holds."""

    def encode_array(self, values: pa.Array) -> list[bytes | None]:
        """Every value of ``values`` as bytes (None for a null)."""
        return [None if v is None else self.encode(v) for v in values.to_pylist()]

    def decode_array(self, data: Sequence[bytes | None]) -> pa.Array:
        """The values as an Arrow array of :attr:`arrow_type` (None becomes a null)."""
        if self.arrow_type is None:
            raise ConfigError(
                f"state serializer {self.id!r} has no Arrow type: batch-wise state access needs a serializer "
                "such as 'int64', 'string' or a pyarrow type"
            )
        return pa.array([None if d is None else self.decode(d) for d in data], type=self.arrow_type)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StateSerializer) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.id!r})"


class PrimitiveSerializer(StateSerializer):
    """Fixed-width numbers (struct format ``fmt``, big-endian) or byte strings, with an Arrow type."""

    def __init__(self, id: str, arrow_type: pa.DataType, fmt: str | None) -> None:
        self.id = id
        self.arrow_type = arrow_type
        self._struct = struct.Struct(">" + fmt) if fmt else None
        self._np = np.dtype(">" + {"q": "i8", "d": "f8", "i": "i4", "?": "u1"}[fmt]) if fmt else None
        self.width = self._np.itemsize if self._np is not None else None
        self._unit = arrow_type.unit if pa.types.is_timestamp(arrow_type) else None

    def _plain(self, value: Any) -> Any:
        if self._unit is not None and not isinstance(value, int):
            return pa.scalar(value, self.arrow_type).cast(pa.int64()).as_py()
        if isinstance(value, datetime.date) and pa.types.is_date32(self.arrow_type):
            return (value - datetime.date(1970, 1, 1)).days
        return value

    def encode(self, value: Any) -> bytes:
        if self._struct is not None:
            return self._struct.pack(self._plain(value))
        if isinstance(value, str):
            return value.encode("utf-8")
        if isinstance(value, bytes | bytearray | memoryview):
            return bytes(value)
        raise TypeError(f"state serializer {self.id!r} cannot encode {type(value).__name__}")

    def decode(self, data: bytes) -> Any:
        if self._struct is None:
            text = pa.types.is_string(self.arrow_type) or pa.types.is_large_string(self.arrow_type)
            return data.decode("utf-8") if text else data
        (v,) = self._struct.unpack(data)
        if self._unit is not None or pa.types.is_date32(self.arrow_type):
            return pa.scalar(v, pa.int64() if self._unit else pa.int32()).cast(self.arrow_type).as_py()
        return v

    def encode_array(self, values: pa.Array) -> list[bytes | None]:
        if self._np is None:
            return _byte_strings(values)
        n = len(values)
        plain = values.cast(pa.int64()) if self._unit is not None else values
        if pa.types.is_date32(self.arrow_type):
            plain = values.cast(pa.int32())
        if values.null_count:
            plain = plain.fill_null(False if pa.types.is_boolean(plain.type) else 0)
        nums = np.asarray(plain.to_numpy(zero_copy_only=False)).astype(self._np)
        out = cast("list[bytes | None]", rows_as_bytes(nums.view(np.uint8).reshape(n, self._np.itemsize)))
        if values.null_count:
            for i in np.flatnonzero(~np.asarray(values.is_valid().to_numpy(zero_copy_only=False))).tolist():
                out[i] = None
        return out

    def encode_binary(self, values: pa.Array) -> pa.Array:
        """Every value of ``values`` (without nulls) as a binary array of its :meth:`encode` bytes."""
        if self._np is None:
            return values.cast(pa.binary())
        n = len(values)
        plain = values.cast(pa.int64()) if self._unit is not None else values
        if pa.types.is_date32(self.arrow_type):
            plain = values.cast(pa.int32())
        nums = np.asarray(plain.to_numpy(zero_copy_only=False)).astype(self._np)
        offsets = np.arange(n + 1, dtype=np.int32) * self._np.itemsize
        return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(nums.tobytes())])

    def decode_array(self, data: Sequence[bytes | None]) -> pa.Array:
        if self._np is None:
            binary = pa.array(data, pa.large_binary() if _large(self.arrow_type) else pa.binary())
            return binary if binary.type == self.arrow_type else binary.cast(self.arrow_type)
        n = len(data)
        mask = None
        if None in data:
            present = np.fromiter(map(operator.is_not, data, repeat(None)), dtype=bool, count=n)
            nums = np.zeros(n, dtype=self._np.newbyteorder("="))
            nums[present] = np.frombuffer(b"".join(filter(None, data)), dtype=self._np)  # values are never empty
            mask = ~present
        else:
            nums = np.frombuffer(b"".join(data), dtype=self._np).astype(self._np.newbyteorder("="))  # type: ignore[arg-type]
        if self._unit is not None:
            return pa.array(nums.astype(np.int64), pa.int64(), mask=mask).cast(self.arrow_type)
        if pa.types.is_date32(self.arrow_type):
            return pa.array(nums.astype(np.int32), pa.int32(), mask=mask).cast(self.arrow_type)
        if pa.types.is_boolean(self.arrow_type):
            return pa.array(nums.astype(bool), self.arrow_type, mask=mask)
        return pa.array(nums, self.arrow_type, mask=mask)


def _large(t: pa.DataType) -> bool:
    return bool(pa.types.is_large_string(t) or pa.types.is_large_binary(t))


def _byte_strings(values: pa.Array) -> list[bytes | None]:
    """The bytes (UTF-8 for strings) of every value of a string or binary array, None for a null: sliced
    out of the array's data buffer by its offsets."""
    arr = values.cast(pa.large_binary())
    n = len(arr)
    if not n:
        return []
    _, offsets_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int64)[arr.offset : arr.offset + n + 1]
    lo, hi = int(offsets[0]), int(offsets[-1])
    data = data_buf[lo:hi].to_pybytes() if data_buf is not None else b""
    bounds = (offsets - lo).tolist()
    out: list[bytes | None] = [data[a:b] for a, b in pairwise(bounds)]
    if arr.null_count:
        for i in np.flatnonzero(~np.asarray(arr.is_valid().to_numpy(zero_copy_only=False))).tolist():
            out[i] = None
    return out


class StructSerializer(StateSerializer):
    """A struct as a row: a null bitmap, then each field by its own serializer, length-prefixed."""

    def __init__(self, arrow_type: pa.StructType) -> None:
        self.arrow_type = arrow_type
        self.id = f"row:{arrow_type}"
        self._fields = [(f.name, serializer_for(f.type)) for f in arrow_type]
        self._bitmap = (len(self._fields) + 7) // 8

    def _join(self, parts: Sequence[bytes | None]) -> bytes:
        bits = 0
        out = []
        for i, p in enumerate(parts):
            if p is None:
                bits |= 1 << i
            else:
                out.append(len(p).to_bytes(4, "big") + p)
        return bits.to_bytes(self._bitmap, "big") + b"".join(out)

    def encode(self, value: Any) -> bytes:
        return self.encode_array(pa.array([value], self.arrow_type))[0] or b""

    def decode(self, data: bytes) -> Any:
        bits = int.from_bytes(data[: self._bitmap], "big")
        at = self._bitmap
        row: dict[str, Any] = {}
        for i, (name, ser) in enumerate(self._fields):
            if bits >> i & 1:
                row[name] = None
                continue
            n = int.from_bytes(data[at : at + 4], "big")
            row[name] = ser.decode(data[at + 4 : at + 4 + n])
            at += 4 + n
        return row

    def encode_array(self, values: pa.Array) -> list[bytes | None]:
        assert isinstance(values, pa.StructArray)
        columns = [ser.encode_array(values.field(i)) for i, (_, ser) in enumerate(self._fields)]
        valid = values.is_valid().to_pylist()
        return [self._join(parts) if ok else None for ok, parts in zip(valid, zip(*columns, strict=True), strict=True)]

    def decode_array(self, data: Sequence[bytes | None]) -> pa.Array:
        return pa.array([None if d is None else self.decode(d) for d in data], type=self.arrow_type)


class ArrowIpcSerializer(StateSerializer):
    """Any Arrow type (lists, maps, decimals): each value as one Arrow IPC record batch message."""

    def __init__(self, arrow_type: pa.DataType) -> None:
        self.arrow_type = arrow_type
        self.id = f"arrow:{arrow_type}"
        self._schema = pa.schema([pa.field("v", arrow_type)])

    def encode(self, value: Any) -> bytes:
        return self.encode_array(pa.array([value], self.arrow_type))[0] or b""

    def decode(self, data: bytes) -> Any:
        return pa.ipc.read_record_batch(pa.py_buffer(data), self._schema).column(0)[0].as_py()

    def encode_array(self, values: pa.Array) -> list[bytes | None]:
        return [
            None if not values[i].is_valid
            else pa.record_batch([values.slice(i, 1)], schema=self._schema).serialize().to_pybytes()
            for i in range(len(values))
        ]  # fmt: skip


class PickleStateSerializer(StateSerializer):
    """Any Python value, pickled: the default for descriptors that name no serializer.

    Pickled state lives only in RocksDB files and checkpoint files whose contents the job's checkpoint key
    authenticates before anything is decoded (docs/security.md).
    """

    id = "pickle"

    def encode(self, value: Any) -> bytes:
        return pickle.dumps(value, protocol=5)

    def decode(self, data: bytes) -> Any:
        return pickle.loads(data)


_PRIMITIVES: dict[str, tuple[pa.DataType, str | None]] = {
    "int64": (pa.int64(), "q"),
    "float64": (pa.float64(), "d"),
    "bool": (pa.bool_(), "?"),
    "string": (pa.string(), None),
    "binary": (pa.binary(), None),
    "date32": (pa.date32(), "i"),
}
_ALIASES = {"int": "int64", "long": "int64", "double": "float64", "float": "float64", "boolean": "bool",
            "str": "string", "utf8": "string", "bytes": "binary"}  # fmt: skip
_PICKLE = PickleStateSerializer()


def serializer_for(spec: StateSerializer | pa.DataType | str | None) -> StateSerializer:
    """The serializer ``spec`` names: None (pickle), a name (``"int64"``, ``"float64"``, ``"bool"``,
    ``"string"``, ``"binary"``, ``"date32"``, ``"timestamp[us]"``, ``"pickle"``), a pyarrow type, or a
    serializer itself."""
    if spec is None or spec == "pickle":
        return _PICKLE
    if isinstance(spec, StateSerializer):
        return spec
    if isinstance(spec, str):
        name = _ALIASES.get(spec.strip().lower(), spec.strip().lower())
        if name in _PRIMITIVES:
            return PrimitiveSerializer(name, *_PRIMITIVES[name])
        if name.startswith("timestamp[") and name.endswith("]"):
            unit, _, tz = name[10:-1].partition(",")
            try:
                return serializer_for(pa.timestamp(unit.strip(), tz.strip() or None))
            except (ValueError, KeyError):
                pass
        raise ConfigError(
            f"state serializer {spec!r} is not known (allowed: int64, float64, bool, string, binary, date32, "
            "timestamp[unit], pickle, a pyarrow type or a StateSerializer)"
        )
    if isinstance(spec, pa.DataType):
        for name, (t, _) in _PRIMITIVES.items():
            if spec == t:
                return serializer_for(name)
        if pa.types.is_large_string(spec) or pa.types.is_large_binary(spec):
            return PrimitiveSerializer(str(spec), spec, None)
        if pa.types.is_timestamp(spec):
            return PrimitiveSerializer(f"timestamp[{spec.unit}{', ' + spec.tz if spec.tz else ''}]", spec, "q")
        if pa.types.is_integer(spec) or pa.types.is_floating(spec):
            return ArrowIpcSerializer(spec)
        if pa.types.is_struct(spec):
            return StructSerializer(spec)
        return ArrowIpcSerializer(spec)
    raise ConfigError(f"state serializer: expected a name, a pyarrow type or a StateSerializer, got {spec!r}")
