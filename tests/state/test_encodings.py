"""Explicit state serializers and the stable key encoding: the same bytes from Python values and from Arrow
arrays, decodable back, self-delimiting."""

from __future__ import annotations

import datetime
import random
import zoneinfo
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from sluice.errors import ConfigError
from sluice.state.keycodec import (
    decode_key,
    encode_key,
    encode_keys,
    encode_keys_fixed,
    key_end,
    namespace_part,
    rows_as_bytes,
    split_entry,
    state_id,
    state_prefix,
)
from sluice.state.serializers import (
    ArrowIpcSerializer,
    PickleStateSerializer,
    StructSerializer,
    serializer_for,
)

UTC = datetime.UTC
PARIS = zoneinfo.ZoneInfo("Europe/Paris")

SAMPLES: list[tuple[Any, list[Any]]] = [
    ("int64", [0, -1, 2**63 - 1, -(2**63), 42]),
    ("float64", [0.0, -2.5, 1e300, float("inf")]),
    ("bool", [True, False]),
    ("string", ["", "héllo", "x" * 1000]),
    ("binary", [b"", b"\x00\xff", b"abc"]),
    ("date32", [datetime.date(1970, 1, 1), datetime.date(1900, 3, 1), datetime.date(2024, 2, 29)]),
    ("timestamp[us]", [datetime.datetime(2024, 1, 2, 3, 4, 5, 6), datetime.datetime(1960, 1, 1)]),
    (pa.timestamp("ms", "UTC"), [datetime.datetime(2024, 1, 2, 3, 4, 5, 6000, tzinfo=UTC)]),
]


@pytest.mark.parametrize(("spec", "values"), SAMPLES, ids=[str(s[0]) for s in SAMPLES])
def test_primitive_serializers_round_trip_one_by_one_and_as_arrays(spec: Any, values: list[Any]) -> None:
    ser = serializer_for(spec)
    assert ser.arrow_type is not None
    for v in values:
        assert ser.decode(ser.encode(v)) == v
    array = pa.array([*values, None], ser.arrow_type)
    encoded = ser.encode_array(array)
    assert encoded[-1] is None and encoded[:-1] == [ser.encode(v) for v in values]
    assert ser.decode_array(encoded).equals(array)
    assert ser.decode_array(encoded[:-1]).equals(array.slice(0, len(values)))
    # whole columns at once: nulls anywhere, arrays that are slices of larger ones
    mixed = pa.array([None, *values, None, *values], ser.arrow_type).slice(1)
    assert ser.encode_array(mixed) == [None if v is None else ser.encode(v) for v in mixed.to_pylist()]
    assert ser.decode_array(ser.encode_array(mixed)).equals(mixed)
    assert ser.encode_array(mixed.slice(0, 0)) == [] and len(ser.decode_array([])) == 0


def test_fixed_width_encodings_are_struct_encodings() -> None:
    assert serializer_for("int64").encode(1) == b"\x00" * 7 + b"\x01"
    assert serializer_for("float64").encode(1.0) == b"?\xf0" + b"\x00" * 6
    assert serializer_for("bool").encode(True) == b"\x01"
    assert serializer_for("string").encode("é") == "é".encode()


def test_struct_and_nested_values() -> None:
    t = pa.struct([("a", pa.int64()), ("b", pa.string()), ("inner", pa.struct([("x", pa.float64())]))])
    ser = serializer_for(t)
    assert isinstance(ser, StructSerializer) and ser.id == f"row:{t}"
    values = [{"a": 1, "b": "x", "inner": {"x": 0.5}}, {"a": None, "b": None, "inner": None}, None]
    array = pa.array(values, t)
    assert ser.decode_array(ser.encode_array(array)).to_pylist() == values
    assert ser.decode(ser.encode(values[0])) == values[0]
    lists = serializer_for(pa.list_(pa.int32()))
    assert isinstance(lists, ArrowIpcSerializer)
    assert lists.decode(lists.encode([1, 2, None])) == [1, 2, None]
    dec = serializer_for(pa.decimal128(10, 2))
    assert dec.decode_array(dec.encode_array(pa.array([Decimal("1.25")], pa.decimal128(10, 2)))).to_pylist() == [Decimal("1.25")]


def test_pickle_is_the_default_and_names_are_checked() -> None:
    assert isinstance(serializer_for(None), PickleStateSerializer) and serializer_for(None).arrow_type is None
    assert serializer_for("long") == serializer_for(pa.int64()) == serializer_for("int64")
    with pytest.raises(ConfigError, match="state serializer 'int65' is not known") as info:
        serializer_for("int65")
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="batch-wise state access needs a serializer"):
        serializer_for(None).decode_array([b""])


KEYS: list[Any] = [
    None, True, False, 0, 1, -1, 2**63 - 1, -(2**63), 2**64 - 1, 0.0, -0.0, 1.5, float("nan"), "", "a", "héllo",
    b"", b"\x00", datetime.date(2020, 1, 1), datetime.datetime(2020, 1, 1, 12), datetime.datetime(2020, 1, 1, tzinfo=UTC),
    datetime.datetime(2020, 6, 1, 12, tzinfo=PARIS), (1, "a"), (None, b"x", 2.0), ((1, 2), "nested"),
]  # fmt: skip


@pytest.mark.parametrize("key", KEYS, ids=repr)
def test_keys_decode_back_and_are_self_delimiting(key: Any) -> None:
    data = encode_key(key)
    back = decode_key(data)
    if isinstance(key, float) and key != key:
        assert back != back
    else:
        assert back == key and type(back) is type(key)
    assert key_end(data + b"trailing") == len(data)


def test_zero_and_nan_have_one_encoding_each() -> None:
    assert encode_key(0.0) == encode_key(-0.0)
    assert encode_key(float("nan")) == encode_key(-float("nan"))


@pytest.mark.parametrize(
    "column",
    [
        pa.array([1, -5, None, 2**40], pa.int64()),
        pa.array(range(1000), pa.int32()),
        pa.array([0, 2**64 - 1, 2**63], pa.uint64()),
        pa.array(["a", None, "ü", ""]),
        pa.array(["a", "b"], pa.large_string()),
        pa.array([b"x", None], pa.binary()),
        pa.array([1.5, None, -0.0]),
        pa.array([True, None]),
        pa.array([datetime.date(2021, 5, 1)], pa.date32()),
        pa.array([datetime.datetime(2021, 5, 1, 1, 2, 3)], pa.timestamp("us")),
        pa.array([datetime.datetime(2021, 5, 1, 1, 2, 3, tzinfo=UTC)], pa.timestamp("ms", "UTC")),
        pa.array([datetime.datetime(2021, 5, 1, 1, 2, 3, tzinfo=UTC)], pa.timestamp("s", "Europe/Paris")),
        pa.array([datetime.datetime(1969, 12, 31, 23, 59, 59, 999999), None], pa.timestamp("ns")),
        pa.array([datetime.datetime(2021, 5, 1, tzinfo=UTC), None], pa.timestamp("ms", "+01:00")),
        pa.array(["x", "y", "x"]).dictionary_encode(),
    ],
    ids=lambda c: str(c.type),
)
def test_arrow_keys_encode_as_their_python_values(column: pa.Array) -> None:
    assert encode_keys([column]) == [encode_key(v) for v in column.to_pylist()]


def test_nanosecond_timestamps_keep_their_microseconds() -> None:
    """A timestamp key keeps microseconds (as a Python datetime does): nanoseconds below one are dropped,
    floored, where a Python value could not be made of them at all without pandas."""
    ns = pa.array([1_000_000_001, 1_000_000_999, -1], pa.timestamp("ns"))
    us = pa.array([1_000_000, 1_000_000, -1], pa.timestamp("us"))
    assert encode_keys([ns]) == encode_keys([us]) == [encode_key(v) for v in us.to_pylist()]


@pytest.mark.parametrize(
    "columns",
    [
        [pa.array(range(-500, 500), pa.int64())],
        [pa.array([0, 1, -(2**63), 2**63 - 1], pa.int64()).slice(1)],
        [pa.array([3, 255], pa.uint8()), pa.array([2**32 - 1, 0], pa.uint32())],
        [pa.array([1.5, -0.0, 0.0, float("nan"), -float("nan"), float("inf"), -float("inf"), -1e-300])],
        [pa.array([True, False, True]), pa.array([datetime.date(1969, 12, 31), datetime.date(2024, 2, 29), datetime.date(1, 1, 1)])],
        [pa.array([1, 2], pa.int16()), pa.array([0.5, 2.0], pa.float32())],
        [pa.chunked_array([[1, 2], [3]])],
        [pa.array([7, 8]).dictionary_encode()],
    ],
    ids=lambda cs: ",".join(str(c.type) for c in cs),
)
def test_fixed_width_keys_are_the_bytes_of_their_python_values(columns: list[Any]) -> None:
    fixed = encode_keys_fixed(columns)
    assert fixed is not None
    rows = [tuple(c[i].as_py() for c in columns) for i in range(len(columns[0]))]
    expected = [encode_key(r if len(r) > 1 else r[0]) for r in rows]
    assert rows_as_bytes(fixed) == expected == encode_keys(columns)


@pytest.mark.parametrize(
    "column",
    [pa.array([1, None]), pa.array(["a"]), pa.array([2**64 - 1], pa.uint64()), pa.array([datetime.datetime(2020, 1, 1)])],
    ids=lambda c: str(c.type),
)
def test_other_keys_are_not_fixed_width(column: pa.Array) -> None:
    assert encode_keys_fixed([column]) is None
    assert encode_keys_fixed([pa.array(range(len(column))), column]) is None


def test_several_key_columns_encode_as_tuples() -> None:
    a, b = pa.array([1, 2, None]), pa.array(["x", None, "z"])
    assert encode_keys([a, b]) == [encode_key(t) for t in zip(a.to_pylist(), b.to_pylist(), strict=True)]


def test_int_and_float_keys_sort_as_numbers() -> None:
    rng = random.Random(7)
    ints = [rng.randint(-(2**63), 2**63 - 1) for _ in range(200)]
    assert sorted(ints) == [decode_key(k) for k in sorted(encode_key(i) for i in ints)]
    floats = [rng.uniform(-1e6, 1e6) for _ in range(200)] + [float("-inf"), float("inf")]
    assert sorted(floats) == [decode_key(k) for k in sorted(encode_key(f) for f in floats)]


def test_unsupported_keys_are_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match="a state key of type Decimal cannot be stored") as info:
        encode_key(Decimal("1.5"))
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="does not fit 64 bits"):
        encode_key(2**64)


def test_entries_split_back_into_their_parts() -> None:
    entry = state_prefix(300, state_id("counts")) + encode_key(("k", 1)) + namespace_part(b"win") + b"user"
    assert split_entry(entry) == (300, "counts", encode_key(("k", 1)), b"win", b"user")
    with pytest.raises(ConfigError, match="1 to 255 bytes"):
        state_id("")
