"""The Debezium formats: change events (``op``, ``before``, ``after``, ``source``, ``ts_ms``) as change batches.

``debezium-json`` reads what Kafka Connect's ``JsonConverter`` writes, with (``schemas.enable=true``) or
without the ``schema``/``payload`` envelope, for values and keys alike; ``debezium-avro`` reads the Avro
envelope in the Confluent wire format through ``schema_registry``, keys too. ``op`` ``c``, ``u``, ``d``,
``r`` become :class:`sluice.changes.Op` INSERT, UPDATE, DELETE, READ; the row is ``after``, for a delete
``before``; the key columns are the message key's fields (Debezium writes the table's primary key there)
unless ``key_columns`` names row columns. Options: :class:`~.change_options.DebeziumOptions`.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from sluice.changes import Op
from sluice.connectors.kafka.errors import IncompatibleSchemaError
from sluice.connectors.kafka.formats.avro import AvroDecoder
from sluice.connectors.kafka.formats.base import (
    DECODE_ERRORS,
    Format,
    FormatOptions,
    ValueDecoder,
    error_text,
)
from sluice.connectors.kafka.formats.change_options import DebeziumOptions, change_options
from sluice.connectors.kafka.formats.changes import ChangeDecoder, Changes
from sluice.connectors.kafka.formats.keys import ConnectJsonDecoder
from sluice.connectors.kafka.formats.messages import TIMESTAMP
from sluice.connectors.kafka.formats.schema_registry import client_for
from sluice.connectors.kafka.formats.schemas import align, widen
from sluice.errors import ConfigError

__all__ = ["DebeziumAvroFormat", "DebeziumDecoder", "DebeziumJsonFormat"]

#: Debezium's ``op`` codes, in the order of :class:`sluice.changes.Op`
OPS = pa.array(["c", "u", "d", "r"])


def _rows(col: pa.Array, schema: pa.Schema) -> pa.RecordBatch:
    """A ``before``/``after`` column as row columns of ``schema`` (a null row: all null)."""
    if not pa.types.is_struct(col.type):
        return pa.RecordBatch.from_arrays([pa.nulls(len(col), f.type) for f in schema], schema=schema)
    # flatten: a null struct's children may hold values (the columnar Avro decoder leaves zeros there)
    return align(pa.RecordBatch.from_arrays(col.flatten(), names=[f.name for f in col.type]), schema)


def _row_schema(before: pa.DataType, after: pa.DataType) -> pa.Schema:
    schema: pa.Schema | None = None
    for t in (after, before):
        if pa.types.is_struct(t):
            schema = widen(schema, pa.schema(list(t)))
    return schema if schema is not None else pa.schema([])


class DebeziumDecoder(ChangeDecoder):
    """Debezium change events (decoded by ``values`` into columns ``op``, ``before``, ``after``...)."""

    def __init__(self, values: ValueDecoder, keys: ValueDecoder, options: DebeziumOptions, row_schema: pa.Schema | None) -> None:
        super().__init__(
            values,
            keys,
            key_columns=options.key_columns,
            tombstone_deletes=options.tombstones == "delete",
            row_schema=row_schema,
        )
        self.source_fields = options.source_fields
        self.ts_ms = options.ts_ms

    def _changes(self, decoded: pa.RecordBatch) -> Changes:
        n = decoded.num_rows
        names = decoded.schema.names

        def column(name: str) -> pa.Array:
            return decoded.column(name) if name in names else pa.nulls(n)

        op = column("op")
        if not pa.types.is_string(op.type):
            op = op.cast(pa.string()) if not pa.types.is_struct(op.type) else pa.nulls(n, pa.string())
        codes = pc.index_in(op, value_set=OPS).to_numpy(zero_copy_only=False)
        unknown = np.isnan(codes) if codes.dtype.kind == "f" else np.zeros(n, dtype=bool)
        ops = np.where(unknown, 0, codes).astype(np.int8)
        before, after = column("before"), column("after")
        is_delete = ops == Op.DELETE
        bad = [
            (i, f"op must be one of 'c', 'u', 'd', 'r' (got {op[i].as_py()!r})")
            for i in np.flatnonzero(unknown).tolist()
        ]
        no_after = after.is_null().to_numpy(zero_copy_only=False) & ~is_delete & ~unknown
        bad += [(i, f"a change with op {op[i].as_py()!r} needs an 'after' row") for i in np.flatnonzero(no_after).tolist()]
        # the row is after, for a delete before: only the types of the sides in use must agree
        after_t = after.type if (~is_delete & ~unknown).any() else pa.null()
        before_t = before.type if is_delete.any() else pa.null()
        try:
            schema = self.row_schema or _row_schema(before_t, after_t)
        except IncompatibleSchemaError as exc:  # the after rows win; the deletes' before rows do not fit them
            schema, before = _row_schema(pa.null(), after_t), pa.nulls(n)
            bad += [(i, f"the before row of a delete does not fit the batch's after rows: {exc}") for i in np.flatnonzero(is_delete).tolist()]
        a_idx, d_idx = np.flatnonzero(~is_delete), np.flatnonzero(is_delete)
        try:
            both = pa.Table.from_batches([_rows(after.take(a_idx), schema), _rows(before.take(d_idx), schema)])
        except DECODE_ERRORS as exc:  # a row that does not fit the given schema
            return Changes(pa.RecordBatch.from_pylist([]), ops, bad=[(i, error_text(exc)) for i in range(n)])
        pos = np.empty(n, dtype=np.int64)
        pos[a_idx], pos[d_idx] = np.arange(a_idx.size), a_idx.size + np.arange(d_idx.size)
        rows = both.take(pa.array(pos)).combine_chunks().to_batches()
        return Changes(
            rows[0] if rows else pa.RecordBatch.from_pylist([], schema=schema), ops, self._extra(decoded), sorted(bad)
        )

    def _extra(self, decoded: pa.RecordBatch) -> dict[str, pa.Array]:
        n, names = decoded.num_rows, decoded.schema.names
        extra: dict[str, pa.Array] = {}
        source = decoded.column("source") if "source" in names else None
        for f in self.source_fields:
            has = source is not None and pa.types.is_struct(source.type) and source.type.get_field_index(f) >= 0
            extra[f"_source_{f}"] = pc.struct_field(source, f) if has else pa.nulls(n, pa.string())
        if self.ts_ms:
            ts = decoded.column("ts_ms") if "ts_ms" in names else pa.nulls(n, pa.int64())
            extra["_ts_ms"] = ts.cast(pa.int64()).cast(TIMESTAMP)
        return extra

    def _extra_nulls(self, n: int) -> dict[str, pa.Array]:
        extra: dict[str, pa.Array] = {f"_source_{f}": pa.nulls(n, pa.string()) for f in self.source_fields}
        if self.ts_ms:
            extra["_ts_ms"] = pa.nulls(n, TIMESTAMP)
        return extra


def _envelope_hint(row: pa.Schema | None) -> pa.Schema:
    fields = [pa.field("op", pa.string()), pa.field("ts_ms", pa.int64())]
    if row is not None:
        fields = [pa.field("before", pa.struct(list(row))), pa.field("after", pa.struct(list(row))), *fields]
    return pa.schema(fields)


class DebeziumJsonFormat(Format):
    """``format="debezium-json"``: JSON change events, with or without the Kafka Connect schema envelope."""

    name = "debezium-json"
    takes = frozenset({"format_options"})

    def check(self, options: FormatOptions) -> None:
        change_options(DebeziumOptions, options.format_options, self.name)

    def infers_schema(self, options: FormatOptions) -> bool:
        return True  # the envelope's (row columns typed by ``schema`` if given)

    def decoder(self, options: FormatOptions) -> DebeziumDecoder:
        opts = change_options(DebeziumOptions, options.format_options, self.name)
        values = ConnectJsonDecoder(_envelope_hint(options.value_schema), explicit=False)
        values.max_record_bytes = options.max_record_bytes
        return DebeziumDecoder(values, ConnectJsonDecoder(None), opts, options.value_schema)


class DebeziumAvroFormat(Format):
    """``format="debezium-avro"``: Avro change events (and keys) in the Confluent wire format."""

    name = "debezium-avro"
    takes = frozenset({"schema_registry", "format_options"})

    def check(self, options: FormatOptions) -> None:
        if options.schema_registry is None:
            raise ConfigError(
                "KafkaSource: format 'debezium-avro' needs schema_registry (the registry Debezium's "
                "AvroConverter writes the schemas of keys and values to)"
            )
        change_options(DebeziumOptions, options.format_options, self.name)

    def decoder(self, options: FormatOptions) -> DebeziumDecoder:
        opts = change_options(DebeziumOptions, options.format_options, self.name)
        assert options.schema_registry is not None
        registry = client_for(options.schema_registry)
        values = AvroDecoder(registry, None, None)
        values.max_record_bytes = options.max_record_bytes
        return DebeziumDecoder(values, AvroDecoder(registry, None, None), opts, options.value_schema)
