"""The PostgreSQL sink's writer: buffers a checkpoint's rows, and at pre-commit writes them in one
transaction with a marker row and prepares it (``PREPARE TRANSACTION``): durable, invisible until committed.

Rows go in with ``COPY ... FROM STDIN (FORMAT csv)`` (pyarrow writes the CSV, vectorized) when every column
has a type the CSV text carries exactly (numbers, text, booleans, dates, times, timestamps, decimals); other
columns (bytes, lists, structs) go row by row through psycopg's ``COPY`` adapters. Upsert rows go into the
stage table (a transaction that touches the target's keys would hold their row locks until the checkpoint
completes, and writers of other subtasks, or of the next checkpoint, would wait on them); the commit merges
them.
"""

from __future__ import annotations

import io
import json
import logging
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
from sluice.sink import SinkContext, SinkWriter
from sluice.sinks.postgres.options import PostgresSinkOptions, connect
from sluice.sinks.postgres.outage import is_transient, ride_out
from sluice.sinks.postgres.schema import (
    STAGE_GID,
    STAGE_SEQ,
    ensure_stage_table,
    ensure_table,
    ident,
    stage_name,
)
from sluice.sinks.postgres.transactions import PostgresCommittable, gid_prefix, make_gid

__all__ = ["PostgresWriter", "copy_rows"]

log = logging.getLogger("sluice.sinks.postgres")


def _csv_exact(t: pa.DataType) -> bool:
    return bool(
        pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_string(t)
        or pa.types.is_large_string(t) or pa.types.is_date(t) or pa.types.is_timestamp(t)
        or pa.types.is_time(t) or pa.types.is_decimal(t)
    )  # fmt: skip


def _row_value(v: Any) -> Any:
    """A Python value of a column the CSV path does not carry, as psycopg's COPY adapters take it."""
    from psycopg.types.json import Jsonb

    if isinstance(v, list | dict):
        return Jsonb(v, dumps=lambda x: json.dumps(x, default=str))
    return v


def copy_rows(conn: Any, table: str, rows: pa.Table) -> None:
    """``COPY`` ``rows`` into ``table`` (its columns by name), in ``conn``'s transaction."""
    from psycopg import sql

    cols = sql.SQL(", ").join(sql.Identifier(n) for n in rows.column_names)
    if all(_csv_exact(f.type) for f in rows.schema):
        buf = io.BytesIO()
        pacsv.write_csv(rows, buf, pacsv.WriteOptions(include_header=False, quoting_style="all_valid"))
        stmt = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(ident(table), cols)
        with conn.cursor() as cur, cur.copy(stmt) as copy:
            copy.write(buf.getbuffer())
        return
    stmt = sql.SQL("COPY {} ({}) FROM STDIN").format(ident(table), cols)
    with conn.cursor() as cur, cur.copy(stmt) as copy:
        for batch in rows.to_batches():
            for row in zip(*(c.to_pylist() for c in batch.columns), strict=True):
                copy.write_row([_row_value(v) for v in row])


class PostgresWriter(SinkWriter[PostgresCommittable]):
    """One writer subtask: the rows of the running checkpoint, and one prepared transaction per checkpoint with
    rows. A connection kept open checks the table and rolls back orphans; each transaction has a connection of
    its own, closed once prepared (DB-API: a connection that prepared a transaction is bound to it until its
    ``tpc_commit``, which the committer does later, from its own connection)."""

    def __init__(self, options: PostgresSinkOptions, ctx: SinkContext) -> None:
        self.options = options
        self.ctx = ctx
        self._conn: Any = None
        self._checked: set[pa.Schema] = set()
        self._buffer: list[pa.RecordBatch] = []

    def _connection(self) -> Any:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self.options)
        return self._conn

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        if batch.schema not in self._checked:  # the table created or checked before the first row is kept
            ride_out(self.options, "checking the table", lambda: self._check_table(batch.schema))
            self._checked.add(batch.schema)
        self._buffer.append(batch)

    def _check_table(self, schema: pa.Schema) -> None:
        try:
            conn = self._connection()
            ensure_table(conn, self.options, schema)
            if self.options.mode == "upsert":
                ensure_stage_table(conn, self.options)
        except Exception as exc:
            if is_transient(exc):
                self.close()  # a new connection on the next try
            raise

    def prepare_commit(self, checkpoint_id: int) -> list[PostgresCommittable]:
        if not self._buffer:
            return []
        batches, self._buffer = self._buffer, []
        rows = sum(b.num_rows for b in batches)
        ctx, o = self.ctx, self.options
        gid = make_gid(ctx.job_id, o.sink_key, ctx.subtask, checkpoint_id, ctx.attempt)
        tries: list[int] = []

        def prepare() -> None:
            tries.append(1)
            self._prepare(gid, checkpoint_id, batches, again=len(tries) > 1)

        ride_out(o, f"pre-commit of checkpoint {checkpoint_id}", prepare)
        ctx.metric("postgres_prepared_rows", rows)
        return [PostgresCommittable(gid, ctx.job_id, ctx.subtask, checkpoint_id, rows)]

    def _prepare(self, gid: str, checkpoint_id: int, batches: list[pa.RecordBatch], again: bool) -> None:
        """Write ``batches`` and the marker in transaction ``gid`` and prepare it. ``again``: an earlier try
        lost its connection, maybe after its PREPARE went through: then there is nothing left to do."""
        try:
            self._roll_back_orphans(self._connection())
            if again and self._is_prepared(self._connection(), gid):
                return
        except Exception as exc:
            if is_transient(exc):
                self.close()
            raise
        conn = connect(self.options)
        try:
            conn.tpc_begin(gid)
            self._write_rows(conn, gid, batches)
            self._insert_marker(conn, gid, checkpoint_id)
            self.ctx.fault_hook("pre_commit")  # rows written, not prepared: lost with the session
            conn.tpc_prepare()
        finally:
            conn.close()  # the prepared transaction stays; an unprepared one is rolled back with the session

    @staticmethod
    def _is_prepared(conn: Any, gid: str) -> bool:
        row = conn.execute("SELECT count(*) FROM pg_prepared_xacts WHERE gid = %s", (gid,)).fetchone()
        conn.rollback()
        return bool(row[0])

    def _roll_back_orphans(self, conn: Any) -> None:
        """Roll back what writers of earlier attempts of this job prepared after the restore's recovery ran
        (a writer that had not yet noticed its attempt failed): at the restore every transaction a completed
        checkpoint names was committed, so theirs can only be orphans, which would keep their rows and locks."""
        import psycopg

        prefix = gid_prefix(self.ctx.job_id, self.options.sink_key)
        rows = conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND starts_with(gid, %s)",
            (prefix,),
        ).fetchall()
        conn.rollback()
        for (gid,) in rows:
            attempt = gid.rsplit(":a", 1)[-1]
            if attempt.isdigit() and int(attempt) < self.ctx.attempt:
                try:
                    conn.tpc_rollback(gid)
                except psycopg.errors.UndefinedObject:  # another writer rolled it back first
                    conn.rollback()
                log.info(
                    "%s: rolled back %s, prepared by an earlier attempt after the restore",
                    self.options.table,
                    gid,
                )

    def _write_rows(self, conn: Any, gid: str, batches: list[pa.RecordBatch]) -> None:
        by_schema: dict[pa.Schema, list[pa.RecordBatch]] = {}
        for b in batches:
            by_schema.setdefault(b.schema, []).append(b)
        seq = 0
        for schema, group in by_schema.items():
            table = pa.Table.from_batches(group, schema)
            if self.options.mode == "append":
                copy_rows(conn, self.options.table, table)
                continue
            n = table.num_rows
            table = table.append_column(STAGE_GID, pa.array([gid] * n, pa.string()))
            table = table.append_column(STAGE_SEQ, pa.array(range(seq, seq + n), pa.int64()))
            seq += n
            copy_rows(conn, stage_name(self.options), table)

    def _insert_marker(self, conn: Any, gid: str, checkpoint_id: int) -> None:
        from psycopg import sql

        conn.execute(
            sql.SQL(
                "INSERT INTO {} (job, sink, subtask, checkpoint, attempt, gid) VALUES (%s, %s, %s, %s, %s, %s)"
            ).format(ident(self.options.marker_table)),
            (self.ctx.job_id, self.options.sink_key, self.ctx.subtask, checkpoint_id, self.ctx.attempt, gid),
        )

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # a connection the server dropped
                pass
