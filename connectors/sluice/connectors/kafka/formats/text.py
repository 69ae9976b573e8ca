"""Text formats (one JSON object or CSV row per value) parsed a batch at a time, with steady schemas.

A batch of values is joined with ``b"\\n"`` and parsed by one ``pyarrow.json``/``pyarrow.csv`` call; only
when that fails (or yields another number of rows than values) is the batch decoded record by record, to
find the bad records.

Without an explicit schema the stream's schema is *steady*: it starts from the sample the enumerator took
across partitions (or the first batch), and later batches may only widen it (:mod:`.schemas`): a ``1.5``
after ``1`` makes the column double, a field seen only as null takes the type of its first value, new
fields are added. A value that does not widen is a bad record whose error names the field and both types.
"""

from __future__ import annotations

from abc import abstractmethod

import numpy as np
import pyarrow as pa
from sluice.connectors.kafka.errors import IncompatibleSchemaError
from sluice.connectors.kafka.formats.base import (
    DECODE_ERRORS,
    Decoded,
    RowCountError,
    ValueDecoder,
    error_text,
    to_batch,
)
from sluice.connectors.kafka.formats.schemas import align, widen

__all__ = ["TextDecoder"]


class TextDecoder(ValueDecoder):
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
            raise RowCountError(f"{len(values)} record(s) decoded into {table.num_rows} row(s)")
        return to_batch(table)

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
        return Decoded(to_batch(table), np.asarray(good, dtype=np.int64), bad)

