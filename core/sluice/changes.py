"""The change model shared by change formats (producers) and upsert sinks (consumers).

A **change batch** is an Arrow table or record batch with

- the **key columns** (never null),
- the **row columns**: the row after the change (for a delete, whatever the source had: the key, the row
  before it, or nulls; only the key is used),
- ``_sluice_op`` (int8, :class:`Op`): insert, update, delete or snapshot read (Debezium's ``c``, ``u``,
  ``d``, ``r``),
- ``_sluice_order`` (int64): the source order of the change, increasing for the changes of one key (the
  Kafka change formats use the record's offset: all changes of one key come from one partition).

A producer that knows the key columns names them in the schema's metadata (:func:`with_keys`), so an
upsert sink given no key columns can take them from the data (:func:`keys_of`).

This module is a leaf: connectors produce change batches and sinks consume them without importing each
other.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import TypeVar

import pyarrow as pa

__all__ = ["KEYS_METADATA", "OP", "ORDER", "Op", "change_table", "keys_of", "with_keys"]

#: the operation column (int8, :class:`Op`)
OP = "_sluice_op"
#: the source order column (int64)
ORDER = "_sluice_order"
#: schema metadata key naming the key columns, comma-separated
KEYS_METADATA = b"sluice.change.keys"

_Data = TypeVar("_Data", pa.Table, pa.RecordBatch)


class Op(enum.IntEnum):
    """What a change does (the value of the ``_sluice_op`` column)."""

    INSERT = 0  #: Debezium ``c``
    UPDATE = 1  #: Debezium ``u``
    DELETE = 2  #: Debezium ``d``, a tombstone, a keyed record with a null value
    READ = 3  #: Debezium ``r``: a row of the source's initial snapshot


def change_table(rows: pa.Table, ops: Sequence[int] | pa.Array, order: Sequence[int] | pa.Array) -> pa.Table:
    """``rows`` (key and row columns) with the operation and source order columns appended."""
    return rows.append_column(OP, pa.array(ops, pa.int8())).append_column(ORDER, pa.array(order, pa.int64()))


def with_keys(data: _Data, keys: Sequence[str]) -> _Data:
    """``data`` with its key columns named in the schema's metadata (see :func:`keys_of`)."""
    metadata = dict(data.schema.metadata or {})
    metadata[KEYS_METADATA] = ",".join(keys).encode()
    return data.replace_schema_metadata(metadata)


def keys_of(schema: pa.Schema) -> tuple[str, ...]:
    """The key columns named in ``schema``'s metadata by :func:`with_keys`; empty when none are named."""
    raw = (schema.metadata or {}).get(KEYS_METADATA, b"")
    return tuple(k for k in raw.decode().split(",") if k)
