"""The keyed-upsert formats: the message key is the row's key, the value the row, a null value deletes it.

``upsert-json`` reads JSON values (as ``format="json"`` with a ``schema`` or a steady inferred one);
``upsert-avro`` Avro values in the Confluent wire format through ``schema_registry``. Keys are a JSON
object or Avro record (its fields are the key columns), or a scalar -- a JSON number or string, UTF-8
text, an Avro primitive -- named by ``key_column``. A value is an upsert (:attr:`sluice.changes.Op.UPDATE`),
a null value a delete. Options: :class:`~.change_options.UpsertOptions`.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from sluice.changes import Op
from sluice.connectors.kafka.formats.avro import AvroDecoder
from sluice.connectors.kafka.formats.base import Format, FormatOptions, ValueDecoder
from sluice.connectors.kafka.formats.change_options import UpsertOptions, change_options
from sluice.connectors.kafka.formats.changes import ChangeDecoder, Changes
from sluice.connectors.kafka.formats.json import JsonDecoder
from sluice.connectors.kafka.formats.keys import ScalarJsonDecoder, StringDecoder
from sluice.connectors.kafka.formats.schema_registry import client_for
from sluice.errors import ConfigError

__all__ = ["UpsertAvroFormat", "UpsertDecoder", "UpsertJsonFormat"]


class UpsertDecoder(ChangeDecoder):
    """Keyed records: every decoded value is an upsert of its row."""

    def _changes(self, decoded: pa.RecordBatch) -> Changes:
        return Changes(decoded, np.full(decoded.num_rows, Op.UPDATE, np.int8))


class _UpsertFormat(Format):
    value_format: str

    def _options(self, options: FormatOptions) -> UpsertOptions:
        opts = change_options(UpsertOptions, options.format_options, self.name)
        key_format = opts.key_format or self.value_format
        if key_format == "string" and opts.key_column is None:
            raise ConfigError(
                f"KafkaSource: format_options['key_format'] 'string' of format {self.name!r} needs "
                "format_options['key_column'] (the name of the key's column)"
            )
        if key_format == "avro" and options.schema_registry is None:
            raise ConfigError(
                f"KafkaSource: Avro keys of format {self.name!r} need schema_registry (keys in the Confluent "
                "wire format)"
            )
        if key_format != "avro" and self.value_format == "json" and options.schema_registry is not None:
            raise ConfigError(
                f"KafkaSource: schema_registry of format {self.name!r} applies to Avro keys "
                "(format_options['key_format'] 'avro')"
            )
        return opts

    def check(self, options: FormatOptions) -> None:
        self._options(options)

    def _keys(self, options: FormatOptions, opts: UpsertOptions) -> ValueDecoder:
        key_format = opts.key_format or self.value_format
        if key_format == "string":
            assert opts.key_column is not None
            return StringDecoder(opts.key_column)
        if key_format == "avro":
            assert options.schema_registry is not None
            return AvroDecoder(client_for(options.schema_registry), None, None)
        return ScalarJsonDecoder(opts.key_column) if opts.key_column is not None else JsonDecoder(None)

    def decoder(self, options: FormatOptions) -> UpsertDecoder:
        opts = self._options(options)
        values = self._values(options)
        values.max_record_bytes = options.max_record_bytes
        return UpsertDecoder(values, self._keys(options, opts), key_column=opts.key_column)

    def _values(self, options: FormatOptions) -> ValueDecoder:
        return JsonDecoder(options.value_schema, explicit=options.value_schema is not None)


class UpsertJsonFormat(_UpsertFormat):
    """``format="upsert-json"``: JSON rows keyed by their message keys (JSON or text)."""

    name = "upsert-json"
    value_format = "json"
    takes = frozenset({"format_options", "schema_registry"})

    def infers_schema(self, options: FormatOptions) -> bool:
        return options.value_schema is None


class UpsertAvroFormat(_UpsertFormat):
    """``format="upsert-avro"``: Avro rows (Confluent wire format) keyed by their message keys."""

    name = "upsert-avro"
    value_format = "avro"
    takes = frozenset({"format_options", "schema_registry"})

    def check(self, options: FormatOptions) -> None:
        if options.schema_registry is None:
            raise ConfigError(
                "KafkaSource: format 'upsert-avro' needs schema_registry (values in the Confluent wire format)"
            )
        super().check(options)

    def _values(self, options: FormatOptions) -> ValueDecoder:
        assert options.schema_registry is not None
        return AvroDecoder(client_for(options.schema_registry), None, options.value_schema)
