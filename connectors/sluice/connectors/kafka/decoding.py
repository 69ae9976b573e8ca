"""Vectorized decoding of Kafka message values into Arrow.

A batch of values is joined with ``b"\\n"`` and parsed by one ``pyarrow.json``/``pyarrow.csv`` call; only
when that fails (or yields another number of rows than values) is the batch decoded record by record, to
find the bad records. Null values (tombstones) are skipped and counted. An inferred schema is pinned after
the first batch so every batch a reader emits has the same schema.
"""

from __future__ import annotations

import io
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.json as pjson

__all__ = ["DEAD_LETTER_SCHEMA", "CsvDecoder", "Decoded", "JsonDecoder", "ValueDecoder", "make_decoder"]

#: columns of the ``dead_letters`` side output
DEAD_LETTER_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("error", pa.string()),
    ]
)


class _RowCountError(ValueError):
    """A batch parsed into another number of rows than it had values (embedded or missing separators)."""


_DECODE_ERRORS = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, _RowCountError)


@dataclass
class Decoded:
    """The result of decoding a list of values.

    Attributes:
        batch: the decoded rows (None if no value decoded).
        rows: indices (into the values) of the rows of ``batch``; None means all values, in order.
        bad: ``(index, error)`` of every value that could not be decoded.
        tombstones: number of null values skipped.
    """

    batch: pa.RecordBatch | None
    rows: np.ndarray | None = None
    bad: list[tuple[int, str]] = field(default_factory=list)
    tombstones: int = 0


class ValueDecoder(ABC):
    """Decodes message values of one format; holds the (given or pinned) schema."""

    def __init__(self, schema: pa.Schema | None) -> None:
        self.schema = schema
        self._explicit = schema is not None

    @abstractmethod
    def _read(self, buf: bytes, schema: pa.Schema | None, multiline: bool) -> pa.Table:
        """Parse newline-separated records; raise an Arrow error on invalid input."""

    def decode(self, values: list[bytes | None]) -> Decoded:
        """Decode ``values`` (one Arrow parse call on the happy path)."""
        rows: np.ndarray | None = None
        tombstones = 0
        if None in values:
            keep = [i for i, v in enumerate(values) if v is not None]
            tombstones = len(values) - len(keep)
            rows = np.asarray(keep, dtype=np.int64)
            values = [values[i] for i in keep]
        if not values:
            return Decoded(None, rows, [], tombstones)
        try:
            batch = self._parse(values)  # type: ignore[arg-type]
        except _DECODE_ERRORS:
            return self._decode_one_by_one(values, rows, tombstones)  # type: ignore[arg-type]
        return Decoded(batch, rows, [], tombstones)

    def _parse(self, values: list[bytes]) -> pa.RecordBatch:
        buf = b"\n".join(values)
        multiline = buf.count(b"\n") != len(values) - 1
        table = self._read(buf, self.schema, multiline)
        if table.num_rows != len(values):
            raise _RowCountError(f"{len(values)} record(s) decoded into {table.num_rows} row(s)")
        if self.schema is None:
            self.schema = table.schema
        return _to_batch(table)

    def _decode_one_by_one(self, values: list[bytes], rows: np.ndarray | None, tombstones: int) -> Decoded:
        good: list[int] = []
        bad: list[tuple[int, str]] = []
        for i, v in enumerate(values):
            try:
                self._parse([v])
                good.append(i)
            except _DECODE_ERRORS as exc:
                bad.append((i, _message(exc)))
        batch = self._parse([values[i] for i in good]) if good else None
        index = np.asarray(good, dtype=np.int64)
        orig = rows[index] if rows is not None else index
        if rows is not None:
            bad = [(int(rows[i]), e) for i, e in bad]
        return Decoded(batch, orig, bad, tombstones)


class JsonDecoder(ValueDecoder):
    """One JSON object per message value (``pyarrow.json``). Unknown fields are ignored under a schema."""

    def _read(self, buf: bytes, schema: pa.Schema | None, multiline: bool) -> pa.Table:
        parse = pjson.ParseOptions(
            explicit_schema=schema,
            newlines_in_values=multiline,
            unexpected_field_behavior="ignore" if schema is not None else "infer",
        )
        read = pjson.ReadOptions(block_size=max(len(buf) + 1, 1 << 20) if schema is None else 1 << 22)
        return pjson.read_json(io.BytesIO(buf), read_options=read, parse_options=parse)


class CsvDecoder(ValueDecoder):
    """One CSV row per message value (``pyarrow.csv``), no header; columns from ``schema`` or f0, f1, ..."""

    def __init__(self, schema: pa.Schema | None, delimiter: str = ",") -> None:
        super().__init__(schema)
        self.delimiter = delimiter

    def _read(self, buf: bytes, schema: pa.Schema | None, multiline: bool) -> pa.Table:
        read = pcsv.ReadOptions(
            column_names=schema.names if schema is not None else None,
            autogenerate_column_names=schema is None,
            block_size=max(len(buf) + 1, 1 << 20),
        )
        parse = pcsv.ParseOptions(
            delimiter=self.delimiter, newlines_in_values=multiline, ignore_empty_lines=False
        )
        convert = pcsv.ConvertOptions(
            column_types=dict(zip(schema.names, schema.types, strict=True)) if schema is not None else None,
            strings_can_be_null=True,
        )
        table = pcsv.read_csv(
            io.BytesIO(buf), read_options=read, parse_options=parse, convert_options=convert
        )
        if schema is not None and table.schema != schema:
            table = table.cast(schema)
        return table


def make_decoder(fmt: str, schema: pa.Schema | None, csv_delimiter: str = ",") -> ValueDecoder | None:
    """The decoder of ``fmt`` (None for ``raw``, whose columns are the message fields themselves)."""
    if fmt == "json":
        return JsonDecoder(schema)
    if fmt == "csv":
        return CsvDecoder(schema, csv_delimiter)
    return None


def _to_batch(table: pa.Table) -> pa.RecordBatch:
    batches = table.combine_chunks().to_batches()
    if len(batches) == 1:
        return batches[0]
    return pa.RecordBatch.from_pylist([], schema=table.schema)


def _message(exc: Any) -> str:
    return f"{type(exc).__name__}: {exc}".strip()
