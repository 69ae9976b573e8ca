"""The ``csv`` format: one CSV row per value (``pyarrow.csv``), no header, with a steady schema unless one
is given."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.csv as pcsv
from sluice.connectors.kafka.formats.base import Format, FormatOptions
from sluice.connectors.kafka.formats.text import TextDecoder

__all__ = ["CsvDecoder", "CsvFormat"]


class CsvDecoder(TextDecoder):
    """One CSV row per message value (``pyarrow.csv``), no header; columns from ``schema`` or f0, f1, ..."""

    def __init__(self, schema: pa.Schema | None, delimiter: str = ",", *, explicit: bool | None = None) -> None:
        super().__init__(schema, explicit=explicit)
        self.delimiter = delimiter

    def _read(self, buf: bytes, hint: pa.Schema | None, multiline: bool) -> pa.Table:
        named = self.schema if self.explicit else None
        read = pcsv.ReadOptions(
            column_names=named.names if named is not None else None,
            autogenerate_column_names=named is None,
            block_size=max(len(buf) + 1, 1 << 20),
        )
        parse = pcsv.ParseOptions(
            delimiter=self.delimiter, newlines_in_values=multiline, ignore_empty_lines=False
        )
        convert = pcsv.ConvertOptions(
            column_types=dict(zip(hint.names, hint.types, strict=True)) if hint is not None else None,
            strings_can_be_null=True,
        )
        table = pcsv.read_csv(  # the final newline: pyarrow cannot infer the columns of one unterminated row
            io.BytesIO(buf + b"\n"), read_options=read, parse_options=parse, convert_options=convert
        )
        if named is not None and table.schema != named:
            table = table.cast(named)
        return table


class CsvFormat(Format):
    """``format="csv"``: fields separated by ``csv_delimiter``."""

    name = "csv"

    def decoder(self, options: FormatOptions) -> CsvDecoder:
        decoder = CsvDecoder(options.value_schema, options.csv_delimiter, explicit=options.value_schema is not None)
        decoder.max_record_bytes = options.max_record_bytes
        return decoder

    def infers_schema(self, options: FormatOptions) -> bool:
        return options.value_schema is None

    def output_schema(self, options: FormatOptions) -> pa.Schema | None:
        return options.value_schema
