"""Decoders of Avro values and of the Confluent wire format (Avro or JSON Schema) with schema ids.

A batch is split by schema id (vectorized, :func:`~sluice.connectors.kafka.registry.split_wire_format`);
each id's records are decoded together and the parts are aligned to **one Arrow schema per batch**:

* Avro: the reader schema is ``avro_schema`` if given, else the newest writer schema seen (the highest id):
  records of older ids are resolved to it by Avro's rules (defaults, promotions), so the output changes
  only when a new version appears. An id whose schema cannot be resolved to the reader schema
  (incompatible change) makes its records bad records.
* JSON Schema: each id's schema maps to Arrow; the stream's schema is the widening of all ids seen
  (:mod:`.schemas`); an id whose schema does not widen makes its records bad records.

Unknown ids (HTTP 404 from the registry), values without the magic byte, schemas of another type and
undecodable payloads are bad records too (``on_bad_record``), each with a message naming the cause. An
unreachable registry fails the job (:class:`~sluice.connectors.kafka.errors.SchemaRegistryError`).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from sluice.connectors.kafka.avro import AvroSchema, columnar_or_none, read_records
from sluice.connectors.kafka.avro_columnar import PAD
from sluice.connectors.kafka.decoding import Decoded, JsonDecoder, ValueDecoder
from sluice.connectors.kafka.errors import (
    IncompatibleSchemaError,
    SchemaNotFoundError,
    UnsupportedSchemaError,
)
from sluice.connectors.kafka.json_schema import json_schema_to_arrow
from sluice.connectors.kafka.registry import (
    SchemaRegistry,
    SchemaRegistryClient,
    client_for,
    split_wire_format,
)
from sluice.connectors.kafka.schemas import align, widen

if TYPE_CHECKING:
    from sluice.connectors.kafka.source import KafkaSource

__all__ = ["AvroDecoder", "JsonSchemaDecoder", "registry_decoder"]

_PADDING = bytes(PAD)
_NOT_WIRE = (
    "not in the Confluent wire format (magic byte 0 and a 4-byte schema id): was it written without a "
    "schema-registry serializer?"
)
_Part = tuple[pa.RecordBatch, np.ndarray]
_Payloads = Callable[[np.ndarray | None], list[bytes]]


class _WireDecoder(ValueDecoder):
    """Splits a batch by schema id, decodes each id's records, aligns the parts to one schema."""

    def __init__(self, registry: SchemaRegistryClient | None, output: pa.Schema | None) -> None:
        self.registry = registry
        self.output = output
        self.schema = output
        self._writers: dict[int, Any] = {}

    def _writer(self, schema_id: int) -> Any:
        """The compiled schema of ``schema_id`` (cached); raises for ids that make records bad."""
        found = self._writers.get(schema_id)
        if found is None:
            assert self.registry is not None
            registered = self.registry.schema(schema_id)
            if registered.references:
                raise UnsupportedSchemaError(
                    f"schema id {schema_id} references other schemas, which sluice does not resolve yet"
                )
            found = self._writers[schema_id] = self._compile(
                schema_id, registered.schema_type, registered.schema
            )
        return found

    @abstractmethod
    def _compile(self, schema_id: int, schema_type: str, text: str) -> Any:
        """Compile a registered schema; UnsupportedSchemaError if it has the wrong type or no Arrow form."""

    @abstractmethod
    def _prepare(self, writers: dict[int, Any], bad: dict[int, str]) -> None:
        """Pick the batch's target before its groups decode; may move ids from ``writers`` to ``bad``."""

    @abstractmethod
    def _group(
        self, writer: Any, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, payloads: _Payloads
    ) -> tuple[list[_Part], list[tuple[int, str]]]:
        """Decode one id's records: parts with rows local to the group, and bad (local index, error).
        ``payloads(sel)`` gives the payload bytes of the group's records ``sel`` (None: all)."""

    @abstractmethod
    def _target(self) -> pa.Schema:
        """The schema every part is aligned to."""

    def _decode(self, values: list[bytes]) -> Decoded:
        lens = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
        starts = np.zeros(len(values), dtype=np.int64)
        np.cumsum(lens[:-1], out=starts[1:])
        ends = starts + lens
        buf = np.frombuffer(b"".join([*values, _PADDING]), dtype=np.uint8)
        bad: list[tuple[int, str]] = []
        if self.registry is not None:
            ids, ok = split_wire_format(values)
            bad.extend((int(i), _NOT_WIRE) for i in np.flatnonzero(~ok))
            starts = starts + 5
        else:
            ids, ok = np.zeros(len(values), dtype=np.int64), np.ones(len(values), dtype=bool)
        writers: dict[int, Any] = {}
        failed: dict[int, str] = {}
        for sid in np.unique(ids[ok]).tolist():
            try:
                writers[sid] = self._writer(sid) if self.registry is not None else None
            except (SchemaNotFoundError, UnsupportedSchemaError) as exc:
                failed[sid] = str(exc)
        self._prepare(writers, failed)
        parts: list[_Part] = []
        for sid in np.unique(ids[ok]).tolist():
            idx = np.flatnonzero(ok & (ids == sid))
            if sid in failed:
                bad.extend((int(i), failed[sid]) for i in idx)
                continue
            off = 5 if self.registry is not None else 0

            def payloads(sel: np.ndarray | None, idx: np.ndarray = idx, off: int = off) -> list[bytes]:
                picked = idx if sel is None else idx[sel]
                return [values[i][off:] for i in picked.tolist()]

            got, group_bad = self._group(writers[sid], buf, starts[idx], ends[idx], payloads)
            parts.extend((b, idx[r]) for b, r in got if b.num_rows)
            bad.extend((int(idx[i]), e) for i, e in group_bad)
        bad.sort()
        if not parts:
            return Decoded(None, np.zeros(0, dtype=np.int64), bad)
        target = self._target()
        rows = np.concatenate([r for _, r in parts])
        table = pa.Table.from_batches([align(b, target) for b, _ in parts], schema=target)
        if len(parts) > 1:
            order = np.argsort(rows, kind="stable")
            table, rows = table.take(order), rows[order]
        batch = table.combine_chunks().to_batches()[0]
        if self.output is not None:
            batch = align(batch, self.output)
        full = rows.size == len(values) and not bad
        return Decoded(batch, None if full else rows, bad)


class AvroDecoder(_WireDecoder):
    """Avro values: plain (``avro_schema`` is the writer schema) or in the wire format (registry ids)."""

    def __init__(
        self, registry: SchemaRegistryClient | None, avro_schema: AvroSchema | None, output: pa.Schema | None
    ) -> None:
        super().__init__(registry, output)
        self._fixed = avro_schema
        self._reader: AvroSchema | None = avro_schema

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
        self, writer: Any, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, payloads: _Payloads
    ) -> tuple[list[_Part], list[tuple[int, str]]]:
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


class JsonSchemaDecoder(_WireDecoder):
    """JSON values in the wire format; each id's JSON Schema gives the Arrow types; ids widen together."""

    def __init__(self, registry: SchemaRegistryClient, output: pa.Schema | None) -> None:
        super().__init__(registry, output)
        self._stream: pa.Schema | None = None

    def _compile(self, schema_id: int, schema_type: str, text: str) -> JsonDecoder:
        if schema_type != "JSON":
            raise UnsupportedSchemaError(
                f"schema id {schema_id} is a {schema_type} schema, not a JSON Schema"
            )
        try:
            arrow = json_schema_to_arrow(text)
        except UnsupportedSchemaError as exc:
            raise UnsupportedSchemaError(f"schema id {schema_id}: {exc}") from None
        return JsonDecoder(arrow, explicit=True)

    def _prepare(self, writers: dict[int, Any], bad: dict[int, str]) -> None:
        for sid in sorted(writers):
            try:
                self._stream = widen(self._stream, writers[sid].schema)
            except IncompatibleSchemaError as exc:
                bad[sid] = f"schema id {sid} is incompatible with the earlier ones: {exc}"
                del writers[sid]

    def _group(
        self, writer: Any, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, payloads: _Payloads
    ) -> tuple[list[_Part], list[tuple[int, str]]]:
        d = writer.decode(payloads(None))
        if d.batch is None:
            return [], d.bad
        rows = np.arange(d.batch.num_rows, dtype=np.int64) if d.rows is None else d.rows
        return [(d.batch, rows)], d.bad

    def _target(self) -> pa.Schema:
        assert self._stream is not None
        self.schema = self.output or self._stream
        return self._stream


def registry_decoder(source: KafkaSource) -> ValueDecoder:
    """The decoder of an ``avro`` source, or of a ``json`` source with a schema registry."""
    client = (
        client_for(SchemaRegistry.of(source.schema_registry)) if source.schema_registry is not None else None
    )
    if source.format == "avro":
        fixed = AvroSchema.option(source.avro_schema) if source.avro_schema is not None else None
        return AvroDecoder(client, fixed, source.schema)
    assert client is not None
    return JsonSchemaDecoder(client, source.schema)
