"""The ``avro`` format: Avro binary values, plain (``avro_schema`` is the writer schema) or in the Confluent
wire format (``schema_registry``), decoded column by column where the schemas allow (:mod:`.avro_schema`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
from sluice.connectors.kafka.errors import UnsupportedSchemaError
from sluice.connectors.kafka.formats.avro_schema import AvroSchema, columnar_or_none, read_records
from sluice.connectors.kafka.formats.base import Format, FormatOptions
from sluice.connectors.kafka.formats.schema_registry import SchemaRegistryClient, client_for
from sluice.connectors.kafka.formats.wire import Part, Payloads, WireDecoder
from sluice.errors import ConfigError

__all__ = ["AvroDecoder", "AvroFormat"]


class AvroDecoder(WireDecoder):
    """Avro values: plain (``avro_schema`` is the writer schema) or in the wire format (registry ids)."""

    def __init__(
        self, registry: SchemaRegistryClient | None, avro_schema: AvroSchema | None, output: pa.Schema | None
    ) -> None:
        super().__init__(registry, output)
        self._fixed = avro_schema
        self._reader: AvroSchema | None = avro_schema

    @property
    def reader_schema(self) -> AvroSchema | None:
        """The reader schema (``avro_schema``, or the newest id met so far; None before the first)."""
        return self._reader

    def _compile(self, schema_id: int, schema_type: str, text: str) -> AvroSchema:
        if schema_type != "AVRO":
            raise UnsupportedSchemaError(f"schema id {schema_id} is a {schema_type} schema, not Avro")
        return AvroSchema(text, schema_id)

    def _prepare(self, writers: dict[int, Any], bad: dict[int, str]) -> None:
        if self._fixed is not None or not writers:
            return
        newest = max(writers)
        if self._reader is None or self._reader.schema_id is None or newest > self._reader.schema_id:
            self._reader = writers[newest]

    def _group(
        self, writer: Any, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, payloads: Payloads
    ) -> tuple[list[Part], list[tuple[int, str]]]:
        reader = self._reader
        assert reader is not None
        writer = writer if writer is not None else reader
        fast = columnar_or_none(writer, reader, buf, starts, ends)
        if fast is None:
            batch, good, bad = read_records(payloads(None), writer, reader)
            return [(self._cast(batch), np.asarray(good, dtype=np.int64))], bad
        batch, flagged = fast
        parts = [(self._cast(batch.filter(pa.array(~flagged))), np.flatnonzero(~flagged))]
        if not flagged.any():
            return parts, []
        # fastavro has the last word on the records the columnar pass flagged (and the precise error)
        again = np.flatnonzero(flagged)
        b2, good2, bad2 = read_records(payloads(again), writer, reader)
        parts.append((self._cast(b2), again[np.asarray(good2, dtype=np.int64)]))
        return parts, [(int(again[i]), e) for i, e in bad2]

    def _cast(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        assert self._reader is not None
        logical = self._reader.logical
        if batch.schema.equals(logical):
            return batch
        return (
            pa.Table.from_batches([batch]).cast(logical).combine_chunks().to_batches()[0]
            if batch.num_rows
            else (pa.RecordBatch.from_pylist([], schema=logical))
        )

    def _target(self) -> pa.Schema:
        assert self._reader is not None
        self.schema = self.output or self._reader.logical
        return self._reader.logical


class AvroFormat(Format):
    """``format="avro"``: needs ``schema_registry`` or ``avro_schema`` (or both: the reader schema)."""

    name = "avro"
    takes = frozenset({"schema_registry", "avro_schema"})

    def check(self, options: FormatOptions) -> None:
        if options.avro_schema is not None:
            AvroSchema.option(options.avro_schema)
        elif options.schema_registry is None:
            raise ConfigError(
                "KafkaSource: format 'avro' needs schema_registry (Confluent wire format) or avro_schema "
                "(the writer schema of plain Avro values)"
            )

    def decoder(self, options: FormatOptions) -> AvroDecoder:
        registry = options.schema_registry
        fixed = AvroSchema.option(options.avro_schema) if options.avro_schema is not None else None
        decoder = AvroDecoder(client_for(registry) if registry is not None else None, fixed, options.value_schema)
        decoder.max_record_bytes = options.max_record_bytes
        return decoder
