"""Rows as Kafka records: key and value bytes, partition, timestamp and header values, vectorized per batch.

The result is a batch of :data:`STAGED` columns (plus one binary column ``h:<name>`` per header column):
what the exactly-once writer stages at pre-commit and what every delivery mode produces. Encoding happens in
``write`` (a value that cannot be encoded fails there, before any checkpoint stages it), never at commit.

Formats: ``json`` (an object per row; flat rows of numbers, booleans and text are built with Arrow compute
kernels, others through ``json.dumps``), ``raw`` (one column's bytes; text as UTF-8; other types as their
text), ``avro`` and ``json_schema`` (the registry's wire format: ``0x00``, the schema id, then Avro binary or
JSON text).
"""

from __future__ import annotations

import base64
import datetime
import decimal
import functools
import io
import itertools
import json
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from sluice.errors import ConfigError
from sluice.sinks.kafka.options import KafkaSinkOptions
from sluice.sinks.kafka.registry import avro_schema, json_schema, register, wire_prefix

__all__ = ["STAGED", "RecordEncoder", "header_column", "json_values", "producer_rows", "value_columns"]

#: what every encoded batch starts with: partition (-1: the key's, by librdkafka's murmur2 partitioner),
#: key, value, timestamp (ms; 0: the producer's clock)
STAGED = pa.schema(
    [("partition", pa.int32()), ("key", pa.binary()), ("value", pa.binary()), ("timestamp", pa.int64())]
)


def header_column(name: str) -> str:
    """The staged column holding the values of header column ``name``."""
    return f"h:{name}"


def value_columns(options: KafkaSinkOptions, schema: pa.Schema) -> list[str]:
    """The columns a value is made of: ``value_columns``, else every column but the header, partition and
    timestamp columns."""
    if options.value_columns is not None:
        return list(options.value_columns)
    skip = {*options.header_columns, options.partition_by, options.timestamp_column}
    return [n for n in schema.names if n not in skip]


def _json_default(v: Any) -> Any:
    if isinstance(v, datetime.datetime | datetime.date | datetime.time):
        return v.isoformat()
    if isinstance(v, decimal.Decimal | uuid.UUID):
        return str(v)
    if isinstance(v, bytes):
        return base64.b64encode(v).decode()
    raise TypeError(f"{type(v).__name__} is not JSON serializable")


def _fast_json_ok(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
                or pa.types.is_string(t) or pa.types.is_large_string(t))  # fmt: skip


def _json_fragment(col: pa.Array) -> pa.Array | None:
    """``col``'s values as JSON text (null as ``null``), or None if a value needs the slow path."""
    t = col.type
    if pa.types.is_floating(t):
        if pc.any(pc.invert(pc.is_finite(col.fill_null(0)))).as_py():
            return None
        text = pc.cast(col, pa.string())
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        col = pc.cast(col, pa.string())
        if pc.any(pc.match_substring_regex(col, r"[\x00-\x1f]")).as_py():
            return None
        escaped = pc.replace_substring(pc.replace_substring(col, "\\", "\\\\"), '"', '\\"')
        text = pc.binary_join_element_wise(pa.scalar('"'), escaped, pa.scalar('"'), pa.scalar(""))
    else:
        text = pc.cast(col, pa.string())
    return pc.fill_null(text, "null")


def json_values(table: pa.Table | pa.RecordBatch, columns: Sequence[str]) -> pa.Array:
    """One JSON object per row of ``columns`` (binary)."""
    sub = table.select(list(columns))
    if sub.num_rows and all(_fast_json_ok(f.type) for f in sub.schema):
        parts: list[Any] = []
        for i, name in enumerate(sub.column_names):
            frag = _json_fragment(sub.column(i))
            if frag is None:
                break
            parts += [pa.scalar(("{" if i == 0 else ",") + json.dumps(name) + ":"), frag]
        else:
            parts.append(pa.scalar("}"))
            joined = pc.binary_join_element_wise(*parts, pa.scalar(""))
            return pc.cast(joined, pa.binary())
    dumps = json.dumps
    return pa.array(
        [dumps(r, default=_json_default, separators=(",", ":")).encode() for r in sub.to_pylist()],
        pa.binary(),
    )


def _raw(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    t = col.type
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return pc.cast(col, pa.binary())
    if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
        col = pc.cast(col, pa.string())
    return pc.cast(col, pa.binary())


def _with_prefix(values: pa.Array, prefix: bytes) -> pa.Array:
    joined = pc.binary_join_element_wise(pa.scalar(prefix), values, pa.scalar(b""))
    return pc.if_else(pc.is_null(values), pa.scalar(None, pa.binary()), joined)


class _Part:
    """The encoder of one record part (key or value): a function of a batch and the columns it reads."""

    def __init__(self, options: KafkaSinkOptions, part: str, fmt: str, schema_text: Any) -> None:
        self.options = options
        self.part = part
        self.fmt = fmt
        self.schema_text = schema_text
        self._avro: Any = None
        self._prefix: bytes | None = None

    def _schema_id(self, schema: str, schema_type: str) -> bytes:
        if self._prefix is None:
            assert self.options.schema_registry is not None
            given = self.options.value_subject if self.part == "value" else self.options.key_subject
            subject = given or f"{self.options.topic}-{self.part}"
            self._prefix = wire_prefix(register(self.options.schema_registry, subject, schema, schema_type))
        return self._prefix

    def _schema_string(self, derive: Callable[[], dict[str, Any]]) -> str:
        given = self.schema_text
        if given is None:  # derived from the stream only when not given: a given schema covers any type
            return json.dumps(derive(), separators=(",", ":"))
        return given if isinstance(given, str) else json.dumps(given, separators=(",", ":"))

    def encode(self, batch: pa.RecordBatch, columns: list[str]) -> pa.Array:
        if self.fmt == "raw":
            if len(columns) != 1:
                raise ConfigError(
                    f"KafkaSink: {self.part}_format 'raw' writes one column, and the {self.part} has {columns}: "
                    f"name one in {'value_columns' if self.part == 'value' else 'key'}"
                )
            return _raw(batch.column(columns[0]))
        if self.fmt == "json":
            return json_values(batch, columns)
        sub = batch.select(columns)
        name = f"{self.options.topic.replace('-', '_').replace('.', '_')}_{self.part}"
        if self.fmt == "json_schema":
            prefix = self._schema_id(self._schema_string(lambda: json_schema(sub.schema, name)), "JSON")
            return _with_prefix(json_values(sub, columns), prefix)
        return self._avro_values(sub, name)

    def _avro_values(self, sub: pa.RecordBatch, name: str) -> pa.Array:
        import fastavro

        text = self._schema_string(lambda: avro_schema(sub.schema, name))
        prefix = self._schema_id(text, "AVRO")
        if self._avro is None:
            self._avro = fastavro.parse_schema(json.loads(text))
        out = io.BytesIO()
        offsets = np.zeros(sub.num_rows + 1, dtype=np.int32)
        write = fastavro.schemaless_writer
        for i, record in enumerate(sub.to_pylist()):
            out.write(prefix)
            try:
                write(out, self._avro, record)
            except (ValueError, TypeError, KeyError) as exc:
                raise ConfigError(
                    f"KafkaSink: row {record!r} does not fit the {self.part} Avro schema ({exc}): give a "
                    f"{self.part}_schema that matches the stream, or convert the columns"
                ) from None
            offsets[i + 1] = out.tell()
        data = out.getvalue()
        return pa.Array.from_buffers(
            pa.binary(), sub.num_rows, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
        )


class RecordEncoder:
    """Encodes batches into records for one writer subtask.

    Args:
        options: the sink's options.
        partitions: the topic's partition count.
        subtask: where unkeyed rows start their round robin (subtasks spread over partitions).
    """

    def __init__(self, options: KafkaSinkOptions, partitions: int, subtask: int = 0) -> None:
        self.options = options
        self.partitions = partitions
        self._next = subtask % max(1, partitions)
        self.value = _Part(options, "value", options.value_format, options.value_schema)
        self.key = _Part(options, "key", options.key_format, options.key_schema) if options.key_columns else None

    def _round_robin(self, n: int) -> pa.Array:
        parts = (np.arange(self._next, self._next + n, dtype=np.int64) % self.partitions).astype(np.int32)
        self._next = (self._next + n) % self.partitions
        return pa.array(parts)

    def _partitions(self, batch: pa.RecordBatch, keys: pa.Array | None) -> pa.Array:
        n = batch.num_rows
        rr = self._round_robin(n)
        base = rr if keys is None else pc.if_else(pc.is_null(keys), rr, pa.scalar(-1, pa.int32()))
        col = self.options.partition_by
        if col is None:
            return base
        given = batch.column(col)
        if not pa.types.is_integer(given.type):
            raise ConfigError(
                f"KafkaSink: partition_by column {col!r} must hold integers (it is {given.type})"
            )
        bad = pc.or_(pc.less(given, 0), pc.greater_equal(given, self.partitions))
        if pc.any(bad).as_py():
            first = pc.filter(given, bad)[0].as_py()
            raise ConfigError(
                f"KafkaSink: column {col!r} holds partition {first}, and topic {self.options.topic!r} has "
                f"{self.partitions} partition(s) (0..{self.partitions - 1})"
            )
        return pc.if_else(pc.is_null(given), base, pc.cast(given, pa.int32()))

    def _keys(self, batch: pa.RecordBatch) -> pa.Array | None:
        if self.key is None:
            return None
        cols = list(self.options.key_columns)
        missing = [c for c in cols if c not in batch.schema.names]
        if missing:
            raise ConfigError(
                f"KafkaSink: key column(s) {missing} are not in the stream ({batch.schema.names})"
            )
        keys = self.key.encode(batch, cols)
        all_null = functools.reduce(pc.and_, [pc.is_null(batch.column(c)) for c in cols])
        return pc.if_else(all_null, pa.scalar(None, pa.binary()), keys)

    def _timestamps(self, batch: pa.RecordBatch) -> pa.Array:
        col = self.options.timestamp_column
        if col is None:
            return pa.array(np.zeros(batch.num_rows, dtype=np.int64))
        ts = batch.column(col)
        if pa.types.is_timestamp(ts.type):
            ts = pc.cast(pc.cast(ts, pa.timestamp("ms", ts.type.tz)), pa.int64())
        elif not pa.types.is_integer(ts.type):
            raise ConfigError(
                f"KafkaSink: timestamp_column {col!r} must be a timestamp or epoch ms (it is {ts.type})"
            )
        return pc.fill_null(pc.cast(ts, pa.int64()), 0)

    def encode(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch`` as records (the :data:`STAGED` columns and the header columns)."""
        cols = value_columns(self.options, batch.schema)
        missing = [c for c in cols + list(self.options.header_columns) if c not in batch.schema.names]
        if missing:
            raise ConfigError(f"KafkaSink: column(s) {missing} are not in the stream ({batch.schema.names})")
        keys = self._keys(batch)
        arrays = [
            self._partitions(batch, keys),
            keys if keys is not None else pa.nulls(batch.num_rows, pa.binary()),
            self.value.encode(batch, cols),
            self._timestamps(batch),
        ]
        names = list(STAGED.names)
        for h in self.options.header_columns:
            arrays.append(_raw(batch.column(h)))
            names.append(header_column(h))
        return pa.RecordBatch.from_arrays(arrays, names=names)


def producer_rows(
    staged: pa.Table | pa.RecordBatch, options: KafkaSinkOptions, extra: list[tuple[str, bytes]] | None = None
) -> Iterator[tuple[Any, Any, int, int, list[tuple[str, Any]] | None]]:
    """``(value, key, partition, timestamp, headers)`` per staged row, for ``Producer.produce``; ``extra``:
    headers every record gets (after the static ones)."""
    values = staged.column("value").to_pylist()
    keys = staged.column("key").to_pylist()
    parts = staged.column("partition").to_pylist()
    stamps = staged.column("timestamp").to_pylist()
    static = [(k, v.encode() if isinstance(v, str) else v) for k, v in options.headers.items()]
    static += extra or []
    hcols = [(h, staged.column(header_column(h)).to_pylist()) for h in options.header_columns]
    if not hcols:  # the common case, on the commit's path: no per-row work in Python
        yield from zip(values, keys, parts, stamps, itertools.repeat(static or None))
        return
    for i in range(len(values)):
        yield values[i], keys[i], parts[i], stamps[i], static + [(h, vals[i]) for h, vals in hcols]
