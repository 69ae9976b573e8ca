"""Bucket assignment: Hive-style ``col=value/`` folders and event- or processing-time folders."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from sluice.errors import ConfigError

__all__ = ["NULL_PARTITION", "BucketAssigner"]

#: folder value for nulls (Hive's, understood by Spark and pyarrow)
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
# Hive escapes these in partition values; '%' first so escapes are not escaped again
_ESCAPES = [
    "%",
    "/",
    "\\",
    "=",
    ":",
    "#",
    "?",
    '"',
    "'",
    "*",
    "[",
    "]",
    "{",
    "}",
    "^",
    "\n",
    "\r",
    "\t",
    "\x7f",
]


def _escape(values: pa.Array) -> pa.Array:
    for ch in _ESCAPES:
        values = pc.replace_substring(values, ch, f"%{ord(ch):02X}")
    return values


class BucketAssigner:
    """Maps each row to a bucket path: ``col1=v1/col2=v2``, then the time pattern (``dt=%Y-%m-%d``).

    Args:
        columns: bucket columns, in folder order.
        time_pattern: strftime pattern of the time folders (UTC), or None.
        time_column: event-time column (int64 epoch milliseconds, or a timestamp) for ``time_pattern``;
            None = processing time.
    """

    def __init__(
        self, columns: Sequence[str] = (), time_pattern: str | None = None, time_column: str | None = None
    ) -> None:
        self.columns = list(columns)
        self.time_pattern = time_pattern
        self.time_column = time_column

    def validate(self) -> None:
        """Raise ConfigError for names or patterns that would make folders hidden or ambiguous."""
        for c in self.columns:
            if not isinstance(c, str) or not c or c[0] in "._" or "/" in c or "=" in c:
                raise ConfigError(
                    f"FileSink: bucket_by column {c!r} must be a non-empty name not starting with "
                    "'.' or '_' and without '/' or '=' (such folders are hidden or ambiguous)"
                )
        if len(set(self.columns)) != len(self.columns):
            raise ConfigError(f"FileSink: bucket_by lists a column twice ({self.columns})")
        if self.time_pattern is not None:
            if not isinstance(self.time_pattern, str) or not self.time_pattern.strip("/"):
                raise ConfigError(
                    f"FileSink: time_bucket must be a non-empty strftime pattern such as "
                    f"'dt=%Y-%m-%d/hour=%H' (got {self.time_pattern!r})"
                )
            sample = time.strftime(self.time_pattern, time.gmtime(0))
            if any(seg == "" or seg[0] in "._" for seg in sample.strip("/").split("/")):
                raise ConfigError(
                    f"FileSink: time_bucket {self.time_pattern!r} makes a folder that is empty or "
                    "starts with '.' or '_' (hidden from readers)"
                )
        if self.time_column is not None and self.time_pattern is None:
            raise ConfigError("FileSink: time_column needs time_bucket (a strftime pattern)")

    @property
    def active(self) -> bool:
        return bool(self.columns) or self.time_pattern is not None

    def data_columns(self, schema: pa.Schema) -> list[str]:
        """Columns written into files: all but the bucket columns (Hive style: they live in the path)."""
        return [n for n in schema.names if n not in self.columns]

    def _time_paths(self, batch: pa.RecordBatch, now: float) -> pa.Array | str:
        assert self.time_pattern is not None
        pattern = self.time_pattern.strip("/")
        if self.time_column is None:
            return time.strftime(pattern, time.gmtime(now))
        if self.time_column not in batch.schema.names:
            raise ConfigError(
                f"FileSink: time_column {self.time_column!r} is not a column of the stream "
                f"(columns: {batch.schema.names})"
            )
        col = batch.column(self.time_column)
        if pa.types.is_integer(col.type):
            col = pc.cast(col, pa.int64()).cast(pa.timestamp("ms"))
        elif pa.types.is_timestamp(col.type) and col.type.tz is not None:
            col = pc.cast(col, pa.timestamp(col.type.unit, "UTC")).cast(pa.timestamp(col.type.unit))
        elif not pa.types.is_timestamp(col.type) and not pa.types.is_date(col.type):
            raise ConfigError(
                f"FileSink: time_column {self.time_column!r} must be epoch milliseconds (integer), "
                f"a timestamp or a date (got {col.type})"
            )
        return pc.fill_null(pc.strftime(col, format=pattern), NULL_PARTITION)

    def paths(self, batch: pa.RecordBatch, now: float) -> pa.Array | str:
        """The bucket path of every row (an array), or one path for the whole batch (a str)."""
        parts: list[pa.Array | str] = []
        for c in self.columns:
            if c not in batch.schema.names:
                raise ConfigError(
                    f"FileSink: bucket_by column {c!r} is not a column of the stream "
                    f"(columns: {batch.schema.names})"
                )
            col = batch.column(c)
            vals = (
                pc.cast(col, pa.string())
                if not pa.types.is_boolean(col.type)
                else pc.if_else(col, "true", "false")
            )
            vals = pc.fill_null(_escape(vals), NULL_PARTITION)
            parts.append(pc.binary_join_element_wise(f"{c}=", vals, ""))
        if self.time_pattern is not None:
            parts.append(self._time_paths(batch, now))
        if not parts:
            return ""
        if all(isinstance(p, str) for p in parts):
            return "/".join(parts)
        return pc.binary_join_element_wise(*parts, "/")

    def split(self, batch: pa.RecordBatch, now: float | None = None) -> list[tuple[str, pa.RecordBatch]]:
        """(bucket, rows of that bucket without the bucket columns) for every bucket ``batch`` touches."""
        now = time.time() if now is None else now
        paths = self.paths(batch, now)
        data = batch.select(self.data_columns(batch.schema)) if self.columns else batch
        if isinstance(paths, str):
            return [(paths, data)]
        enc = (
            pc.dictionary_encode(paths).combine_chunks()
            if isinstance(paths, pa.ChunkedArray)
            else pc.dictionary_encode(paths)
        )
        codes = enc.indices.to_numpy(zero_copy_only=False)
        if len(enc.dictionary) == 1:
            return [(enc.dictionary[0].as_py(), data)]
        order = np.argsort(codes, kind="stable")
        sorted_codes = codes[order]
        bounds = np.flatnonzero(np.diff(sorted_codes)) + 1
        starts = np.concatenate([[0], bounds])
        ends = np.concatenate([bounds, [len(order)]])
        taken = data.take(pa.array(order))
        return [
            (enc.dictionary[int(sorted_codes[s])].as_py(), taken.slice(int(s), int(e - s)))
            for s, e in zip(starts, ends, strict=True)
        ]
