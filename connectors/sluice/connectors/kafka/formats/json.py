"""The ``json`` format: one JSON object per value (``pyarrow.json``), with a steady schema unless one is
given; with ``schema_registry``, JSON in the Confluent wire format typed by each id's JSON Schema."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.json as pjson
from sluice.connectors.kafka.errors import IncompatibleSchemaError, UnsupportedSchemaError
from sluice.connectors.kafka.formats.base import Format, FormatOptions, ValueDecoder
from sluice.connectors.kafka.formats.json_schema import json_schema_to_arrow
from sluice.connectors.kafka.formats.schema_registry import SchemaRegistryClient, client_for
from sluice.connectors.kafka.formats.schemas import widen
from sluice.connectors.kafka.formats.text import TextDecoder
from sluice.connectors.kafka.formats.wire import Part, Payloads, WireDecoder

__all__ = ["JsonDecoder", "JsonFormat", "JsonSchemaDecoder"]

_BLOCK = 256 * 1024


class JsonDecoder(TextDecoder):
    """One JSON object per message value (``pyarrow.json``). Unknown fields are ignored under a schema."""

    def _read(self, buf: bytes, hint: pa.Schema | None, multiline: bool) -> pa.Table:
        parse = pjson.ParseOptions(
            explicit_schema=hint,
            newlines_in_values=multiline,
            unexpected_field_behavior="ignore" if self.explicit else "infer",
        )
        # an explicit schema parses in 256 KiB blocks, which pyarrow spreads over its threads (1.5x on two
        # cores for 10k records); inferring types needs the batch in one block, or blocks could disagree
        whole = max(len(buf) + 1, 1 << 20)
        if not self.explicit or len(buf) < _BLOCK:
            return pjson.read_json(
                io.BytesIO(buf), read_options=pjson.ReadOptions(block_size=whole), parse_options=parse
            )
        try:
            read = pjson.ReadOptions(block_size=_BLOCK)
            return pjson.read_json(io.BytesIO(buf), read_options=read, parse_options=parse)
        except pa.ArrowInvalid as exc:
            if "straddl" not in str(exc):  # a record larger than a block: parse the batch as one block
                raise
        read = pjson.ReadOptions(block_size=whole)
        return pjson.read_json(io.BytesIO(buf), read_options=read, parse_options=parse)


class JsonSchemaDecoder(WireDecoder):
    """JSON values in the wire format; each id's JSON Schema gives the Arrow types; ids widen together."""

    def __init__(self, registry: SchemaRegistryClient, output: pa.Schema | None) -> None:
        super().__init__(registry, output)
        self._stream: pa.Schema | None = None

    @property
    def stream_schema(self) -> pa.Schema | None:
        """The widening of every id's schema met so far (None before the first)."""
        return self._stream

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
        self, writer: Any, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, payloads: Payloads
    ) -> tuple[list[Part], list[tuple[int, str]]]:
        d = writer.decode(payloads(None))
        if d.batch is None:
            return [], d.bad
        rows = np.arange(d.batch.num_rows, dtype=np.int64) if d.rows is None else d.rows
        return [(d.batch, rows)], d.bad

    def _target(self) -> pa.Schema:
        assert self._stream is not None
        self.schema = self.output or self._stream
        return self._stream


class JsonFormat(Format):
    """``format="json"``: plain JSON values, or the wire format with ``schema_registry``."""

    name = "json"
    takes = frozenset({"schema_registry"})

    def decoder(self, options: FormatOptions) -> ValueDecoder:
        decoder: ValueDecoder
        if options.schema_registry is not None:
            decoder = JsonSchemaDecoder(client_for(options.schema_registry), options.value_schema)
        else:
            decoder = JsonDecoder(options.value_schema, explicit=options.value_schema is not None)
        decoder.max_record_bytes = options.max_record_bytes
        return decoder

    def infers_schema(self, options: FormatOptions) -> bool:
        return options.value_schema is None and options.schema_registry is None

    def output_schema(self, options: FormatOptions) -> pa.Schema | None:
        return options.value_schema if options.schema_registry is None else None
