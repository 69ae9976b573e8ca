"""Vectorized decoding of Kafka message values (JSON, CSV) into Arrow, with steady schemas.

A batch of values is joined with ``b"\\n"`` and parsed by one ``pyarrow.json``/``pyarrow.csv`` call; only
when that fails (or yields another number of rows than values) is the batch decoded record by record, to
find the bad records. Null values (tombstones) are skipped and counted.

Without an explicit schema the stream's schema is *steady*: it starts from the sample the enumerator took
across partitions (or the first batch), and later batches may only widen it (:mod:`.schemas`): a ``1.5``
after ``1`` makes the column double, a field seen only as null takes the type of its first value, new
fields are added. A value that does not widen is a bad record whose error names the field and both types.
The Avro and schema-registry formats are in :mod:`.wire_decoding`.
"""

from __future__ import annotations

import io
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.json as pjson
from sluice.connectors.kafka.errors import IncompatibleSchemaError
from sluice.connectors.kafka.schemas import align, widen

if TYPE_CHECKING:
    from sluice.connectors.kafka.source import KafkaSource

__all__ = [
    "DEAD_LETTER_SCHEMA",
    "DECODE_ERRORS",
    "CsvDecoder",
    "Decoded",
    "JsonDecoder",
    "ValueDecoder",
    "error_text",
    "make_decoder",
]

#: columns of the ``dead_letters`` side output: where the record was, its key and value as UTF-8 text
#: (``*_text``) or, when they are not valid UTF-8, as base64 (``*_base64``; the other column is null then),
#: the value's size and why it is a dead letter (docs/kafka.md, "Dead letters")
DEAD_LETTER_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("ms", tz="UTC")),
        ("key_text", pa.string()),
        ("key_base64", pa.string()),
        ("value_text", pa.string()),
        ("value_base64", pa.string()),
        ("value_bytes", pa.int64()),
        ("error", pa.string()),
    ]
)


class _RowCountError(ValueError):
    """A batch parsed into another number of rows than it had values (embedded or missing separators)."""


_BLOCK = 256 * 1024

DECODE_ERRORS = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, _RowCountError)


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
    """Decodes message values of one format; ``schema`` is the schema of the batches it returns so far.

    A value longer than ``max_record_bytes`` is a bad record before any parser sees it.
    """

    schema: pa.Schema | None
    #: the longest value decoded (None: no limit)
    max_record_bytes: int | None = None

    def decode(self, values: list[bytes | None], nbytes: int | None = None) -> Decoded:
        """Decode ``values``, skipping (and counting) null values; ``nbytes``, their total length if
        known, spares the length check of batches that cannot hold a value over the limit."""
        limit = self.max_record_bytes
        too_long: list[tuple[int, str]] = []
        if limit is not None and (nbytes is None or nbytes > limit) and _longest(values) > limit:
            too_long = [
                (i, _too_long(len(v), limit)) for i, v in enumerate(values) if v is not None and len(v) > limit
            ]
        if None not in values and not too_long:
            return self._decode(values)  # type: ignore[arg-type]
        skip = {i for i, _ in too_long}
        keep = [i for i, v in enumerate(values) if v is not None and i not in skip]
        kept = np.asarray(keep, dtype=np.int64)
        present: list[bytes] = [values[i] for i in keep]  # type: ignore[misc]
        tombstones = sum(1 for v in values if v is None)
        if not present:
            return Decoded(None, kept, too_long, tombstones)
        d = self._decode(present)
        rows = kept if d.rows is None else kept[d.rows]
        bad = sorted([*too_long, *((int(kept[i]), e) for i, e in d.bad)])
        return Decoded(d.batch, rows, bad, tombstones)

    @abstractmethod
    def _decode(self, values: list[bytes]) -> Decoded:
        """Decode non-null ``values``; indices in the result refer to ``values``."""

    def adopt(self, schema: pa.Schema | None) -> None:  # noqa: B027 - optional hook
        """Start from ``schema`` (inferred by the enumerator, or restored from a checkpoint)."""

    @property
    def steady_schema(self) -> pa.Schema | None:
        """The inferred schema to keep in checkpoints (None when it comes from an option or a registry)."""
        return None


class _TextDecoder(ValueDecoder):
    """Newline-joined text records parsed in one call; steady (widening) schema unless ``explicit``."""

    def __init__(self, schema: pa.Schema | None, *, explicit: bool | None = None) -> None:
        self.schema = schema
        #: the schema is the user's: never widened, unknown fields ignored (default: when one is given)
        self.explicit = schema is not None and (explicit is None or explicit)

    @abstractmethod
    def _read(self, buf: bytes, hint: pa.Schema | None, multiline: bool) -> pa.Table:
        """Parse newline-separated records typed by ``hint`` (other fields inferred, or ignored when the
        schema is explicit); raise an Arrow error on invalid input."""

    @property
    def steady_schema(self) -> pa.Schema | None:
        return None if self.explicit else self.schema

    def adopt(self, schema: pa.Schema | None) -> None:
        if schema is None or self.explicit:
            return
        try:
            self.schema = widen(self.schema, schema)
        except IncompatibleSchemaError:
            pass  # readers widened differently before a rescale: keep ours, misfits become bad records

    def _parse(self, values: list[bytes], hint: pa.Schema | None) -> pa.RecordBatch:
        buf = b"\n".join(values)
        multiline = buf.count(b"\n") != len(values) - 1
        table = self._read(buf, hint, multiline)
        if table.num_rows != len(values):
            raise _RowCountError(f"{len(values)} record(s) decoded into {table.num_rows} row(s)")
        return _to_batch(table)

    def _decode(self, values: list[bytes]) -> Decoded:
        if self.explicit:
            try:
                return Decoded(self._parse(values, self.schema))
            except DECODE_ERRORS:
                return self._explicit_one_by_one(values)
        try:  # known fields typed as before, new fields inferred
            batch = self._parse(values, self.schema)
            self.schema = widen(self.schema, batch.schema)
            return Decoded(align(batch, self.schema))
        except (*DECODE_ERRORS, IncompatibleSchemaError):
            pass
        try:  # a wider value: infer the whole batch again and widen
            batch = self._parse(values, None)
            self.schema = widen(self.schema, batch.schema)
            return Decoded(align(batch, self.schema))
        except (*DECODE_ERRORS, IncompatibleSchemaError):
            return self._steady_one_by_one(values)

    def _explicit_one_by_one(self, values: list[bytes]) -> Decoded:
        good: list[int] = []
        bad: list[tuple[int, str]] = []
        for i, v in enumerate(values):
            try:
                self._parse([v], self.schema)
                good.append(i)
            except DECODE_ERRORS as exc:
                bad.append((i, error_text(exc)))
        batch = self._parse([values[i] for i in good], self.schema) if good else None
        return Decoded(batch, np.asarray(good, dtype=np.int64), bad)

    def _steady_one_by_one(self, values: list[bytes]) -> Decoded:
        """Each value inferred alone and widened into the schema in order; misfits are bad records."""
        schema = self.schema
        parts: list[pa.RecordBatch] = []
        good: list[int] = []
        bad: list[tuple[int, str]] = []
        for i, v in enumerate(values):
            try:
                one = self._parse([v], None)
                schema = widen(schema, one.schema)
            except (*DECODE_ERRORS, IncompatibleSchemaError) as exc:
                bad.append((i, error_text(exc)))
                continue
            parts.append(one)
            good.append(i)
        self.schema = schema
        if not parts:
            return Decoded(None, np.asarray(good, dtype=np.int64), bad)
        assert schema is not None
        table = pa.Table.from_batches([align(p, schema) for p in parts], schema=schema)
        return Decoded(_to_batch(table), np.asarray(good, dtype=np.int64), bad)


class JsonDecoder(_TextDecoder):
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


class CsvDecoder(_TextDecoder):
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


def make_decoder(source: KafkaSource) -> ValueDecoder | None:
    """The decoder of the source's format (None for ``raw``, whose columns are the message fields)."""
    explicit = source.schema is not None
    decoder: ValueDecoder
    if source.format == "avro" or (source.format == "json" and source.schema_registry is not None):
        from sluice.connectors.kafka.wire_decoding import registry_decoder

        decoder = registry_decoder(source)
    elif source.format == "json":
        decoder = JsonDecoder(source.schema, explicit=explicit)
    elif source.format == "csv":
        decoder = CsvDecoder(source.schema, source.csv_delimiter, explicit=explicit)
    else:
        return None
    decoder.max_record_bytes = source.max_record_bytes
    return decoder


def _longest(values: list[bytes | None]) -> int:
    try:
        return max(map(len, values), default=0)  # type: ignore[arg-type]
    except TypeError:  # tombstones
        return max((len(v) for v in values if v is not None), default=0)


def _too_long(n: int, limit: int) -> str:
    return (
        f"the value is {n} bytes, over max_record_bytes ({limit}): raise the KafkaSource option "
        "max_record_bytes (and the brokers' message.max.bytes) to read it"
    )


def _to_batch(table: pa.Table) -> pa.RecordBatch:
    batches = table.combine_chunks().to_batches()
    if len(batches) == 1:
        return batches[0]
    return pa.RecordBatch.from_pylist([], schema=table.schema)


def error_text(exc: Any) -> str:
    """A bad record's error as the dead letter and BadRecordError show it."""
    if isinstance(exc, IncompatibleSchemaError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}".strip()
