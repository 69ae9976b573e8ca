"""Iceberg partition specs from the sink's ``partition_by``: ``"col"`` (identity), ``"<transform>(col)"`` or
``"bucket(n, col)"`` (a hash of the column into ``n`` buckets: what an upsert table's key is best partitioned
by), checked against the stream's schema.

Imports ``pyiceberg`` lazily (the ``sluice-etl[iceberg]`` extra)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from sluice.errors import ConfigError

__all__ = ["TRANSFORMS", "parse_partition", "partition_fields"]

#: partition transforms ``partition_by`` accepts: ``"col"`` (identity), ``"<transform>(col)"``, ``"bucket(n, col)"``
TRANSFORMS = ("identity", "year", "month", "day", "hour", "bucket")
#: the Iceberg types each transform takes (identity: any primitive type)
_TAKES = {
    "identity": "any primitive type",
    "year": "date, timestamp, timestamptz",
    "month": "date, timestamp, timestamptz",
    "day": "date, timestamp, timestamptz",
    "hour": "timestamp, timestamptz",
    "bucket": "int, long, decimal, date, time, timestamp, string, uuid, binary",
}
_SPEC = re.compile(r"^(?:(?P<t>[a-z]+)\((?:(?P<n>\d+)\s*,\s*)?(?P<c>[^(),]+)\)|(?P<plain>[^(),]+))$")


def parse_partition(entry: str) -> tuple[str, str]:
    """``(transform, column)`` of a ``partition_by`` entry (transform as Iceberg spells it: ``"bucket[16]"``);
    ConfigError naming the allowed transforms."""
    m = _SPEC.match(entry.strip()) if isinstance(entry, str) else None
    transform, column = (
        (m.group("t") or "identity", (m.group("c") or m.group("plain")).strip()) if m else ("", "")
    )
    buckets = m.group("n") if m else None
    if not m or transform not in TRANSFORMS or (transform == "bucket") != (buckets is not None) or buckets == "0":
        raise ConfigError(
            f"IcebergSink: partition_by entry {entry!r} must be a column or one of "
            f"{', '.join(t + '(col)' for t in TRANSFORMS if t != 'bucket')}, bucket(n, col) with n >= 1"
        )
    return (f"bucket[{int(buckets)}]" if buckets else transform), column


def partition_fields(partition_by: Sequence[str], schema: Any) -> list[Any]:
    """The PartitionFields of ``partition_by`` over ``schema`` (an Iceberg or Arrow schema); ConfigError
    naming the entry if its column is missing or its transform cannot take the column's type."""
    from pyiceberg.catalog import Catalog as _Catalog
    from pyiceberg.partitioning import PartitionField
    from pyiceberg.transforms import parse_transform

    if isinstance(schema, pa.Schema):
        try:
            schema = _Catalog._convert_schema_if_needed(schema)
        except Exception as exc:  # pyiceberg names the type it cannot store
            raise ConfigError(f"IcebergSink: the stream's schema has no Iceberg equivalent: {exc}") from None
    fields = []
    for i, entry in enumerate(partition_by):
        transform, column = parse_partition(entry)
        try:
            source = schema.find_field(column)
        except ValueError:
            raise ConfigError(
                f"IcebergSink: partition_by column {column!r} is not in the stream ({schema.column_names})"
            ) from None
        t = parse_transform(transform)
        kind = transform.split("[", 1)[0]
        if not t.can_transform(source.field_type):
            raise ConfigError(
                f"IcebergSink: partition_by {entry!r}: column {column!r} has type {source.field_type}, "
                f"which {kind} cannot take ({kind} takes {_TAKES[kind]}); cast the column "
                "upstream or choose another transform"
            )
        name = column if transform == "identity" else f"{column}_{kind}"
        fields.append(PartitionField(source.field_id, 1000 + i, t, name))
    return fields
