"""Tables of the PostgreSQL sink: Arrow types as PostgreSQL types, the target table created or checked, the
upsert stage table and the marker table.

A stream column fits a table column when the table's type is one the Arrow type converts to without loss
(:data:`_ACCEPTS`); table columns the stream lacks must be nullable or have a default. A misfit fails the
job at once with one line naming both schemas (:class:`~sluice.sinks.postgres.errors.PostgresSchemaError`).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from sluice.errors import ConfigError
from sluice.sinks.postgres.errors import PostgresSchemaError
from sluice.sinks.postgres.options import PostgresSinkOptions, split_name

__all__ = [
    "STAGE_GID",
    "STAGE_SEQ",
    "ensure_marker_table",
    "ensure_stage_table",
    "ensure_table",
    "exists",
    "ident",
    "pg_type",
    "stage_name",
    "table_columns",
]

#: the upsert stage table's own columns: the transaction that staged a row, and the row's order in it
STAGE_GID = "_sluice_gid"
STAGE_SEQ = "_sluice_seq"

_INTS = {8: "smallint", 16: "smallint", 32: "integer", 64: "bigint"}
_UINTS = {8: "smallint", 16: "integer", 32: "bigint", 64: "numeric(20,0)"}
#: PostgreSQL types (as information_schema.columns.data_type names them) each Arrow type kind may go to
_ACCEPTS: dict[str, tuple[str, ...]] = {
    "smallint": ("smallint", "integer", "bigint", "numeric", "real", "double precision"),
    "integer": ("integer", "bigint", "numeric", "double precision"),
    "bigint": ("bigint", "numeric"),
    "numeric": ("numeric",),
    "real": ("real", "double precision", "numeric"),
    "double precision": ("double precision", "numeric"),
    "boolean": ("boolean",),
    "text": ("text", "character varying", "character", "json", "jsonb", "uuid"),
    "bytea": ("bytea",),
    "date": ("date", "timestamp without time zone", "timestamp with time zone"),
    "timestamp without time zone": ("timestamp without time zone",),
    "timestamp with time zone": ("timestamp with time zone",),
    "time without time zone": ("time without time zone",),
    "jsonb": ("jsonb", "json"),
}


def pg_type(t: pa.DataType) -> str | None:
    """The PostgreSQL type an Arrow type is created as (None if the sink cannot write it)."""
    if pa.types.is_signed_integer(t):
        return _INTS[t.bit_width]
    if pa.types.is_unsigned_integer(t):
        return _UINTS[t.bit_width]
    if pa.types.is_floating(t):
        return "real" if t.bit_width <= 32 else "double precision"
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "text"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "bytea"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_timestamp(t):
        return "timestamp with time zone" if t.tz else "timestamp without time zone"
    if pa.types.is_time(t):
        return "time without time zone"
    if pa.types.is_decimal(t):
        return f"numeric({t.precision},{t.scale})"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_struct(t) or pa.types.is_map(t):
        return "jsonb"
    return None


def ident(name: str) -> Any:
    """``name`` (``table`` or ``schema.table``) as a quoted SQL identifier."""
    from psycopg import sql

    return sql.Identifier(*split_name(name))


def stage_name(options: PostgresSinkOptions) -> str:
    """The upsert stage table: next to the target, ``<table>__sluice_stage`` (cut to 63 characters)."""
    *schema, table = split_name(options.table)
    return ".".join([*schema, f"{table[:49]}__sluice_stage"])


def _describe(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name}: {f.type}" for f in schema)


def table_columns(conn: Any, name: str) -> list[tuple[str, str, bool]]:
    """``(column, data_type, required)`` of table ``name`` in column order; [] if there is no such table.
    ``required``: NOT NULL without a default."""
    *schema, table = split_name(name)
    rows = conn.execute(
        "SELECT column_name, data_type, is_nullable = 'NO' AND column_default IS NULL "
        "FROM information_schema.columns WHERE table_name = %s "
        "AND table_schema = COALESCE(%s, current_schema()) ORDER BY ordinal_position",
        (table, schema[0] if schema else None),
    ).fetchall()
    return [(str(r[0]), str(r[1]), bool(r[2])) for r in rows]


def _unique_keys(conn: Any, name: str) -> list[set[str]]:
    """The column sets of the table's primary key and unique indexes."""
    rows = conn.execute(
        "SELECT array_agg(a.attname::text) FROM pg_index i "
        "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
        "WHERE i.indrelid = to_regclass(%s) AND i.indisunique GROUP BY i.indexrelid",
        (regclass(name),),
    ).fetchall()
    return [set(r[0]) for r in rows]


def check_schema(
    options: PostgresSinkOptions, schema: pa.Schema, columns: list[tuple[str, str, bool]]
) -> None:
    """Raise PostgresSchemaError (one line, both schemas) if rows of ``schema`` cannot go into ``columns``."""
    table = {c: (t, req) for c, t, req in columns}
    problems: list[str] = []
    for f in schema:
        want = pg_type(f.type)
        if f.name not in table:
            problems.append(f"column {f.name!r} is not in the table")
        elif want is None:
            problems.append(f"column {f.name!r} has type {f.type}, which the sink cannot write")
        elif table[f.name][0] not in _ACCEPTS[want.split("(")[0]]:
            problems.append(f"column {f.name!r} is {f.type} in the stream, {table[f.name][0]} in the table")
    problems += [f"table column {c!r} is NOT NULL without a default and not in the stream"
                 for c, (_, req) in table.items() if req and c not in schema.names]  # fmt: skip
    if problems:
        got = ", ".join(f"{c} {t}" for c, t, _ in columns)
        raise PostgresSchemaError(
            f"PostgresSink {options.table}: the stream's schema ({_describe(schema)}) does not fit the table's "
            f"({got}): {'; '.join(problems)}. Cast or select columns before the sink, or alter the table"
        )


def _create_sql(options: PostgresSinkOptions, schema: pa.Schema) -> Any:
    from psycopg import sql

    cols = []
    for f in schema:
        t = pg_type(f.type)
        if t is None:
            raise PostgresSchemaError(
                f"PostgresSink {options.table}: column {f.name!r} has type {f.type}, which the sink cannot "
                f"write (stream schema: {_describe(schema)}): convert it before the sink"
            )
        null = sql.SQL(" NOT NULL") if f.name in options.key_columns else sql.SQL("")
        cols.append(sql.SQL("{} {}{}").format(sql.Identifier(f.name), sql.SQL(t), null))
    if options.key_columns:
        keys = sql.SQL(", ").join(sql.Identifier(k) for k in options.key_columns)
        cols.append(sql.SQL("PRIMARY KEY ({})").format(keys))
    return sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
        ident(options.table), sql.SQL(", ").join(cols)
    )


def exists(conn: Any, name: str) -> bool:
    """Whether table ``name`` exists: a catalog query under the statement's snapshot (it sees a table another
    session just created, and takes no lock on it)."""
    *schema, table = split_name(name)
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relname = %s AND n.nspname = COALESCE(%s, current_schema()))",
        (table, schema[0] if schema else None),
    ).fetchone()
    return bool(row[0])


def regclass(name: str) -> str:
    """``name`` quoted as ``to_regclass`` takes it."""
    return ".".join(f'"{p}"' for p in split_name(name))


def _locked(conn: Any, what: str) -> None:
    """Take a transaction-level advisory lock on ``what``: DDL of several subtasks goes one at a time."""
    conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"sluice-ddl:{what}",))


def ensure_table(conn: Any, options: PostgresSinkOptions, schema: pa.Schema) -> None:
    """Create the target table from ``schema`` if missing (and allowed), else check that ``schema`` fits it;
    upsert: the key columns must be the table's primary key or a unique index. ``conn`` is not in
    autocommit mode: the DDL commits here."""
    missing_keys = [k for k in options.key_columns if k not in schema.names]
    if missing_keys:
        raise PostgresSchemaError(
            f"PostgresSink {options.table}: key_columns {missing_keys} are not in the stream's schema "
            f"({_describe(schema)})"
        )
    columns = table_columns(conn, options.table)
    conn.rollback()
    if not columns:
        if not options.create_table:
            raise ConfigError(
                f"PostgresSink: table {options.table} does not exist in {_target(options)} and create_table "
                "is False: create it, or let the sink create it"
            )
        with conn.transaction():
            _locked(conn, options.table)
            if not table_columns(conn, options.table):
                conn.execute(_create_sql(options, schema))
                return
        columns = table_columns(conn, options.table)
    keys = _unique_keys(conn, options.table)
    conn.rollback()
    check_schema(options, schema, columns)
    if options.key_columns and set(options.key_columns) not in keys:
        raise PostgresSchemaError(
            f"PostgresSink {options.table}: mode 'upsert' needs a primary key or unique index on exactly "
            f"key_columns {list(options.key_columns)}; the table has none (ON CONFLICT needs one)"
        )


def _target(options: PostgresSinkOptions) -> str:
    from sluice.sinks.postgres.options import safe_target

    return safe_target(options)


def ensure_stage_table(conn: Any, options: PostgresSinkOptions) -> None:
    """Upsert: the stage table (the target's columns, plus the staging transaction and a sequence number)."""
    from psycopg import sql

    found = exists(conn, stage_name(options))  # DDL on it would wait for the prepared transactions' rows
    conn.rollback()
    if found:
        return
    with conn.transaction():
        _locked(conn, stage_name(options))
        if exists(conn, stage_name(options)):
            return
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (LIKE {} INCLUDING DEFAULTS, {} text NOT NULL, {} bigint NOT NULL)"
            ).format(
                ident(stage_name(options)),
                ident(options.table),
                sql.Identifier(STAGE_GID),
                sql.Identifier(STAGE_SEQ),
            )
        )
        idx = sql.Identifier(f"{split_name(stage_name(options))[-1][:50]}_gid")
        conn.execute(
            sql.SQL("CREATE INDEX {} ON {} ({})").format(
                idx, ident(stage_name(options)), sql.Identifier(STAGE_GID)
            )
        )


def ensure_marker_table(conn: Any, options: PostgresSinkOptions) -> None:
    """The marker table: one row per (job, sink, subtask, checkpoint) whose transaction committed."""
    from psycopg import sql

    found = exists(conn, options.marker_table)
    conn.rollback()
    if found:
        return
    with conn.transaction():
        _locked(conn, options.marker_table)
        if exists(conn, options.marker_table):
            return
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (job text NOT NULL, sink text NOT NULL, subtask integer NOT NULL, "
                "checkpoint bigint NOT NULL, attempt integer NOT NULL, gid text NOT NULL, "
                "merged boolean NOT NULL DEFAULT false, written_at timestamptz NOT NULL DEFAULT now(), "
                "PRIMARY KEY (job, sink, subtask, checkpoint))"
            ).format(ident(options.marker_table))
        )
