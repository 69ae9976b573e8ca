"""File formats: Parquet (pyarrow.parquet), JSON lines and CSV (optionally gzip), writers and merge.

A :class:`FormatWriter` writes one file; :func:`merge` concatenates closed files of one format and schema
(compaction). Parquet files are merged by decoding their row groups and re-encoding them into row groups
of ``row_group_size`` rows (pyarrow has no API to copy encoded row groups, and copying them would keep the
tiny row groups of small files anyway). JSON lines and CSV are merged as bytes (decompressing gzip and
dropping repeated CSV headers), without re-parsing.
"""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

__all__ = [
    "COMPRESSIONS",
    "FORMATS",
    "FormatOptions",
    "FormatWriter",
    "extension",
    "merge",
    "open_writer",
    "schema_fingerprint",
    "unwritable_columns",
]

FORMATS = ("parquet", "json", "csv")
COMPRESSIONS = {
    "parquet": ("snappy", "zstd", "gzip", "brotli", "lz4", "none"),
    "json": ("none", "gzip"),
    "csv": ("none", "gzip"),
}


class FormatOptions:
    """Format settings shared by writers and merge (plain attributes, validated by the sink)."""

    def __init__(self, fmt: str, compression: str, row_group_size: int) -> None:
        self.fmt = fmt
        self.compression = compression
        self.row_group_size = row_group_size


def extension(opts: FormatOptions) -> str:
    """File name extension, e.g. ``.parquet`` or ``.jsonl.gz``."""
    base = {"parquet": ".parquet", "json": ".jsonl", "csv": ".csv"}[opts.fmt]
    return base + (".gz" if opts.fmt != "parquet" and opts.compression == "gzip" else "")


def unwritable_columns(schema: pa.Schema, fmt: str) -> list[pa.Field]:
    """The columns of ``schema`` that format ``fmt`` cannot write: nested types in CSV, unions in Parquet."""
    nested = (pa.types.is_nested, pa.types.is_union)
    cannot = {"csv": nested, "parquet": (pa.types.is_union,), "json": ()}[fmt]
    return [f for f in schema if any(check(f.type) for check in cannot)]


def schema_fingerprint(schema: pa.Schema) -> str:
    """Stable id of a schema's fields (metadata ignored)."""
    return hashlib.sha1(schema.remove_metadata().to_string().encode()).hexdigest()[:16]


def _stream(path: str, opts: FormatOptions) -> pa.NativeFile:
    raw = pa.OSFile(path, "wb")
    if opts.fmt != "parquet" and opts.compression == "gzip":
        return pa.CompressedOutputStream(raw, "gzip")
    return raw


class FormatWriter(ABC):
    """Writes one file. ``size()`` estimates its bytes so far (for the rolling policy)."""

    def __init__(self, path: str, schema: pa.Schema, opts: FormatOptions) -> None:
        self.path = path
        self.schema = schema
        self.opts = opts
        self.rows = 0
        self._raw = pa.OSFile(path, "wb")

    @abstractmethod
    def write(self, batch: pa.RecordBatch) -> None: ...

    def size(self) -> int:
        return int(self._raw.tell())

    @abstractmethod
    def close(self) -> None:
        """Flush and close; the file is complete afterwards."""


class _ParquetWriter(FormatWriter):
    def __init__(self, path: str, schema: pa.Schema, opts: FormatOptions) -> None:
        super().__init__(path, schema, opts)
        self._w = pq.ParquetWriter(self._raw, schema, compression=opts.compression)
        self._buf: list[pa.RecordBatch] = []
        self._buf_rows = 0
        self._buf_bytes = 0

    def write(self, batch: pa.RecordBatch) -> None:
        self._buf.append(batch)
        self._buf_rows += batch.num_rows
        self._buf_bytes += batch.nbytes
        self.rows += batch.num_rows
        if self._buf_rows >= self.opts.row_group_size:
            self._flush()

    def _flush(self) -> None:
        if self._buf:
            self._w.write_table(
                pa.Table.from_batches(self._buf, self.schema), row_group_size=self.opts.row_group_size
            )
        self._buf, self._buf_rows, self._buf_bytes = [], 0, 0

    def size(self) -> int:
        return int(self._raw.tell()) + self._buf_bytes

    def close(self) -> None:
        self._flush()
        self._w.close()
        self._raw.close()


def _json_default(v: Any) -> Any:
    if isinstance(v, _dt.datetime | _dt.date | _dt.time):
        return v.isoformat()
    if isinstance(v, _dt.timedelta):
        return v.total_seconds()
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, bytes):
        return base64.b64encode(v).decode()
    raise TypeError(f"cannot write {type(v).__name__} as JSON")


class _JsonWriter(FormatWriter):
    def __init__(self, path: str, schema: pa.Schema, opts: FormatOptions) -> None:
        super().__init__(path, schema, opts)
        self._out = pa.CompressedOutputStream(self._raw, "gzip") if opts.compression == "gzip" else self._raw

    def write(self, batch: pa.RecordBatch) -> None:
        lines = [json.dumps(r, default=_json_default, separators=(",", ":")) for r in batch.to_pylist()]
        if lines:
            self._out.write(("\n".join(lines) + "\n").encode())
        self.rows += batch.num_rows

    def close(self) -> None:
        self._out.close()
        if not self._raw.closed:
            self._raw.close()


class _CsvWriter(FormatWriter):
    def __init__(self, path: str, schema: pa.Schema, opts: FormatOptions) -> None:
        super().__init__(path, schema, opts)
        self._out = pa.CompressedOutputStream(self._raw, "gzip") if opts.compression == "gzip" else self._raw
        self._w = pacsv.CSVWriter(self._out, schema)

    def write(self, batch: pa.RecordBatch) -> None:
        self._w.write_batch(batch)
        self.rows += batch.num_rows

    def close(self) -> None:
        self._w.close()
        self._out.close()
        if not self._raw.closed:
            self._raw.close()


def open_writer(path: str, schema: pa.Schema, opts: FormatOptions) -> FormatWriter:
    """A writer of ``opts.fmt`` for a new file at local ``path``."""
    writers: dict[str, type[FormatWriter]] = {"parquet": _ParquetWriter, "json": _JsonWriter, "csv": _CsvWriter}
    cls = writers[opts.fmt]
    return cls(path, schema, opts)


def merge(
    sources: Iterable[pa.NativeFile], out_path: str, schema: pa.Schema | None, opts: FormatOptions
) -> int:
    """Concatenate ``sources`` (closed files of ``opts.fmt``, one schema) into ``out_path``; returns rows.

    ``schema`` (Parquet) defaults to the first file's.
    """
    rows = 0
    if opts.fmt == "parquet":
        w: pq.ParquetWriter | None = None
        try:
            buf: list[pa.Table] = []
            n = 0
            for src in sources:
                t = pq.read_table(src, schema=schema)
                if w is None:
                    schema = t.schema
                    w = pq.ParquetWriter(out_path, schema, compression=opts.compression)
                buf.append(t)
                n += t.num_rows
                rows += t.num_rows
                if n >= opts.row_group_size:
                    w.write_table(pa.concat_tables(buf), row_group_size=opts.row_group_size)
                    buf, n = [], 0
            if buf and w is not None:
                w.write_table(pa.concat_tables(buf), row_group_size=opts.row_group_size)
        finally:
            if w is not None:
                w.close()
        return rows
    compression = "gzip" if opts.compression == "gzip" else None
    with _stream(out_path, opts) as out:
        for i, src in enumerate(sources):
            data = pa.input_stream(src, compression=compression).read()
            if opts.fmt == "csv" and i > 0:
                data = data[data.find(b"\n") + 1 :] if b"\n" in data else b""
            lines = data.count(b"\n")
            rows += lines - (1 if opts.fmt == "csv" and i == 0 and lines else 0)
            out.write(data)
    return rows
