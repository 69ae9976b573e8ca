"""New columns of an append sink (``schema_mode="merge"``) join the table in the snapshot that brings them.

A data file names its columns by field id, so a writer needs the ids of a column it sees first before it
writes a file, long before the checkpoint completes. The writer therefore adds the column to a schema that
is **not current** (Iceberg keeps every schema a table had; readers read the current one): the catalog
assigns the ids, readers see nothing. The checkpoint's commit then makes current, in the transaction of its
snapshot, the current schema plus the columns its files carry (:func:`stage_new_columns`). A crash before
that commit leaves the table as it was; the restored job's writers find the pending columns again by name
(:func:`writer_schema`) and reuse their ids, so one column never gets two ids.

A pending column is a field of some schema that neither the current schema nor any snapshot's schema has:
no committed file can carry its id.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from sluice.errors import CommitError

if TYPE_CHECKING:
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table, Transaction
    from pyiceberg.types import NestedField

__all__ = ["add_pending_columns", "file_field_ids", "schema_of_ids", "stage_new_columns", "writer_schema"]

log = logging.getLogger("sluice.sinks.iceberg")

_FIELD_ID = b"PARQUET:field_id"


def file_field_ids(schema: pa.Schema) -> list[int]:
    """The field ids of a data file's top-level columns (its Arrow schema's Parquet field ids)."""
    return [int(f.metadata[_FIELD_ID]) for f in schema if f.metadata and _FIELD_ID in f.metadata]


def _top_level(table: Table) -> dict[int, NestedField]:
    """Every top-level field any schema of ``table`` has, by field id (ids are never reused)."""
    out: dict[int, NestedField] = {}
    for schema in table.metadata.schemas:
        for f in schema.fields:
            out.setdefault(f.field_id, f)
    return out


def schema_of_ids(table: Table, ids: Sequence[int]) -> Schema | None:
    """A schema of the fields ``ids`` (in that order) as ``table`` defines them; None if one is unknown."""
    from pyiceberg.schema import Schema

    fields = _top_level(table)
    if any(i not in fields for i in ids):
        return None
    return Schema(*(fields[i] for i in ids))


def _pending(table: Table) -> dict[str, NestedField]:
    """Top-level fields of schemas that were never current for a commit, by name (the newest schema's)."""
    from pyiceberg.schema import index_by_id

    schemas = table.schemas()
    committed = set(index_by_id(table.schema()))
    for snapshot in table.snapshots():
        if snapshot.schema_id is not None and snapshot.schema_id in schemas:
            committed |= set(index_by_id(schemas[snapshot.schema_id]))
    out: dict[str, NestedField] = {}
    for schema_id in sorted(schemas, reverse=True):
        for f in schemas[schema_id].fields:
            if f.field_id not in committed:
                out.setdefault(f.name, f)
    return out


def _same_type(a: NestedField, b: NestedField) -> bool:
    """Whether two fields have one type, whatever the ids of their nested fields."""
    from pyiceberg.schema import Schema, assign_fresh_schema_ids

    return str(assign_fresh_schema_ids(Schema(a)).fields[0].field_type) == str(
        assign_fresh_schema_ids(Schema(b)).fields[0].field_type
    )


def _as_iceberg(fields: Sequence[pa.Field]) -> list[NestedField]:
    """Arrow fields as optional Iceberg fields with ids from 1 (a new column cannot be required: the
    table's rows have no value for it)."""
    from pyiceberg.catalog import Catalog
    from pyiceberg.types import NestedField

    converted = Catalog._convert_schema_if_needed(pa.schema(list(fields)))
    return [
        NestedField(field_id=f.field_id, name=f.name, field_type=f.field_type, required=False, doc=f.doc)
        for f in converted.fields
    ]


def writer_schema(table: Table, new: Sequence[pa.Field]) -> tuple[Schema | None, list[pa.Field]]:
    """The schema a writer's files of a stream with the ``new`` columns (not in the current schema) carry:
    the current schema, then each new column with the id of its pending field. None and the columns that
    have no pending field yet when some are missing (:func:`add_pending_columns` adds them)."""
    from pyiceberg.schema import Schema

    current = table.schema()
    if not new:
        return current, []
    pending = _pending(table)
    found, missing = [], []
    for arrow, wanted in zip(new, _as_iceberg(new), strict=True):
        have = pending.get(arrow.name)
        if have is not None and _same_type(have, wanted):
            found.append(have)
        else:
            missing.append(arrow)
    if missing:
        return None, missing
    return Schema(*current.fields, *found, identifier_field_ids=current.identifier_field_ids), []


def add_pending_columns(table: Table, columns: Sequence[pa.Field]) -> None:
    """Add a schema that is not current: the current one plus ``columns`` with ids the table assigns
    (fails if another writer assigned ids meanwhile: load the table and look again)."""
    from pyiceberg.schema import Schema, assign_fresh_schema_ids
    from pyiceberg.table.update import AddSchemaUpdate, AssertLastAssignedFieldId

    current, last = table.schema(), table.metadata.last_column_id
    counter = itertools.count(last + 1)
    fresh = assign_fresh_schema_ids(Schema(*_as_iceberg(columns)), lambda: next(counter))
    schema = Schema(
        *current.fields,
        *fresh.fields,
        schema_id=max(table.schemas()) + 1,
        identifier_field_ids=current.identifier_field_ids,
    )
    table.catalog.commit_table(
        table, (AssertLastAssignedFieldId.model_validate({"last-assigned-field-id": last}),), (AddSchemaUpdate(schema=schema),)
    )
    log.info("%s: columns %s added to a schema that becomes current with their first commit",
             table.name(), [c.name for c in columns])  # fmt: skip


def stage_new_columns(tx: Transaction, table: Table, file_schemas: Sequence[pa.Schema], what: str) -> None:
    """In the commit's transaction ``tx``: make current the current schema plus the columns the files carry
    that it lacks (pending fields, by id), before the snapshot is staged. Nothing if there are none.

    Raises:
        CommitError: a file carries a field id no schema of the table has, or a name the current schema
            has under another id (another writer added a column of that name meanwhile).
    """
    from pyiceberg.schema import Schema
    from pyiceberg.table.update import AddSchemaUpdate, AssertCurrentSchemaId, SetCurrentSchemaUpdate

    current = table.schema()
    have = {f.field_id for f in current.fields}
    new_ids = sorted({i for s in file_schemas for i in file_field_ids(s)} - have)
    if not new_ids:
        return
    fields = _top_level(table)
    unknown = [i for i in new_ids if i not in fields]
    if unknown:
        raise CommitError(f"{what}: data files carry field ids {unknown} that no schema of the table has")
    added = [fields[i] for i in new_ids]
    names = [f.name for f in current.fields] + [f.name for f in added]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise CommitError(
            f"{what}: columns {clash} were added to the table under other field ids while this checkpoint's "
            "files were written (another writer?): drop them, or give the stream other column names"
        )
    union = Schema(
        *current.fields, *added, schema_id=max(table.schemas()) + 1, identifier_field_ids=current.identifier_field_ids
    )
    existing = next((s.schema_id for s in table.metadata.schemas if s == union), None)
    updates: tuple[Any, ...] = (
        (SetCurrentSchemaUpdate.model_validate({"schema-id": existing}),)
        if existing is not None
        else (AddSchemaUpdate(schema=union), SetCurrentSchemaUpdate.model_validate({"schema-id": -1}))
    )
    tx._apply(updates, (AssertCurrentSchemaId.model_validate({"current-schema-id": current.schema_id}),))
