"""``PostgresSink``: exactly-once into a PostgreSQL table with two-phase commit (one prepared transaction per
writer subtask and checkpoint)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from sluice.errors import ConfigError, SluiceError
from sluice.serializers import SimpleVersionedSerializer
from sluice.sink import Committer, Sink, SinkContext, SinkWriter
from sluice.sinks.postgres.errors import PostgresServerError
from sluice.sinks.postgres.options import PostgresSinkOptions, connect, redact, safe_target, split_name
from sluice.sinks.postgres.outage import ride_out
from sluice.sinks.postgres.schema import (
    ensure_marker_table,
    ensure_stage_table,
    ensure_table,
    exists,
    ident,
    pg_type,
    regclass,
)
from sluice.sinks.postgres.transactions import (
    PostgresCommittable,
    PostgresCommittableSerializer,
    gid_prefix,
)

__all__ = ["PostgresSink"]

log = logging.getLogger("sluice.sinks.postgres")


class PostgresSink(Sink[PostgresCommittable]):
    """Rows land in a PostgreSQL table exactly once: readers see a checkpoint's rows when it completes.

    Lifecycle: writers buffer rows; at a checkpoint's pre-commit each writer subtask writes its rows (``COPY``;
    upsert: into a stage table) and a marker row in one transaction and prepares it (``PREPARE
    TRANSACTION``, durable and invisible); when the checkpoint completes its committer commits it
    (``COMMIT PREPARED``; upsert: then ``INSERT ... ON CONFLICT`` from the stage table). A restore commits
    the prepared transactions of the restored checkpoint and rolls back the others of the job and sink. The
    server needs ``max_prepared_transactions`` above 0 (checked at start). See ``docs/kafka_postgres.md``.

    Args:
        conninfo: libpq connection string or ``postgresql://`` URL (its password is never shown).
        table: the target table, ``name`` or ``schema.name``.
        mode: ``"append"`` or ``"upsert"`` (by ``key_columns``).
        key_columns: upsert key: the table's primary key or a unique index.
        schema: the table's Arrow schema: creates or checks the table at start.
        name: the sink operator's name.
        **options: the rest of :class:`PostgresSinkOptions` (``create_table``, ``marker_table``,
            ``sink_id``, ``password``, ``connect_timeout_s``, ``lock_timeout_s``, ``outage_timeout_s``: a
            server out of reach for less than this, 30 s by default, costs no restart).
    """

    def __init__(
        self,
        conninfo: str,
        table: str,
        *,
        mode: str = "append",
        key_columns: Sequence[str] | str = (),
        schema: pa.Schema | None = None,
        name: str = "postgres-sink",
        **options: Any,
    ) -> None:
        given: dict[str, Any] = {
            "conninfo": conninfo,
            "table": table,
            "mode": mode,
            "key_columns": key_columns,
            "table_schema": schema,
        }
        self.options = PostgresSinkOptions(**given, **options)
        self.name = name

    def __repr__(self) -> str:  # never shows the connection string
        o = self.options
        return f"PostgresSink({o.table!r}, mode={o.mode!r}, target={safe_target(o)!r})"

    def validate(self) -> None:
        """Options are checked when the sink is made; the table's schema, if given, must be writable."""
        if self.options.table_schema is not None:
            self.validate_schema(self.options.table_schema)

    def validate_schema(self, schema: pa.Schema) -> None:
        """At build time: every column has a type the sink can write, and the key columns are there."""
        bad = [f"{f.name}: {f.type}" for f in schema if pg_type(f.type) is None]
        if bad:
            raise ConfigError(
                f"PostgresSink {self.options.table}: column(s) {bad} have types the sink cannot write: convert "
                "them before the sink (map_batches)"
            )
        missing = [k for k in self.options.key_columns if k not in schema.names]
        if missing:
            raise ConfigError(
                f"PostgresSink {self.options.table}: key_columns {missing} are not in the stream ({schema.names})"
            )

    # -- Sink SPI --------------------------------------------------------------------------------------
    def create_writer(self, ctx: SinkContext, restored: list[Any]) -> SinkWriter[PostgresCommittable]:
        from sluice.sinks.postgres.writer import PostgresWriter

        return PostgresWriter(self.options, ctx)

    def create_committer(self, ctx: SinkContext) -> Committer[PostgresCommittable] | None:
        from sluice.sinks.postgres.committer import PostgresCommitter

        return PostgresCommitter(self.options, ctx)

    def committable_serializer(self) -> SimpleVersionedSerializer[PostgresCommittable]:
        """Prepared transaction ids go into checkpoints as JSON."""
        return PostgresCommittableSerializer()

    def committed_checkpoint(self, job_id: str, sink_uid: str) -> int | None:
        """The newest checkpoint of ``job_id`` whose rows this sink committed (its marker rows; 0 if none)."""
        return ride_out(self.options, "reading the markers", lambda: self._committed(job_id))

    def _committed(self, job_id: str) -> int:
        from psycopg import sql

        conn = connect(self.options, autocommit=True)
        try:
            if not exists(conn, self.options.marker_table):
                return 0
            row = conn.execute(
                sql.SQL("SELECT max(checkpoint) FROM {} WHERE job = %s AND sink = %s").format(
                    ident(self.options.marker_table)
                ),
                (job_id, self.options.sink_key),
            ).fetchone()
            return int(row[0] or 0)
        finally:
            conn.close()

    def probe(self) -> None:
        """At job start: the server takes the login and can prepare transactions, and the table (and the
        marker table) can be written, or created where missing."""
        import psycopg

        o = self.options
        conn = connect(o, autocommit=True)
        try:
            _check_server(conn, o)
            for table, option in ((o.table, "table"), (o.marker_table, "marker_table")):
                if exists(conn, table):
                    allowed = conn.execute(
                        "SELECT has_table_privilege(%s, 'INSERT')", (regclass(table),)
                    ).fetchone()[0]
                    if not allowed:
                        raise ConfigError(
                            f"PostgresSink {option} {table!r}: the user of {safe_target(o)} may not INSERT into "
                            "it: GRANT INSERT (and SELECT) to that user, or give another user in conninfo"
                        )
                    continue
                if option == "table" and not o.create_table:
                    raise ConfigError(
                        f"PostgresSink: table {table!r} does not exist in {safe_target(o)} and create_table is "
                        "False: create it, or let the sink create it"
                    )
                *schema, _ = split_name(table)
                allowed = conn.execute(
                    "SELECT has_schema_privilege(COALESCE(%s, current_schema()), 'CREATE')",
                    (schema[0] if schema else None,),
                ).fetchone()[0]
                if not allowed:
                    raise ConfigError(
                        f"PostgresSink {option} {table!r} does not exist and the user of {safe_target(o)} may not "
                        "create it: create it, or GRANT CREATE on its schema"
                    )
        except psycopg.Error as exc:
            raise SluiceError(f"PostgresSink {o.table}: {redact(str(exc), o).strip()}") from None
        finally:
            conn.close()

    def recover(self, job_id: str, committables: Sequence[PostgresCommittable]) -> None:
        """Before the job starts: check the server, create or check the tables, commit the prepared
        transactions the restored checkpoint names and roll back the job's and sink's others."""
        import psycopg

        try:
            ride_out(self.options, "recovery", lambda: self._recover(job_id, committables))
        except psycopg.Error as exc:
            raise SluiceError(
                f"PostgresSink {self.options.table}: recovery failed: {redact(str(exc), self.options).strip()}"
            ) from None

    def _recover(self, job_id: str, committables: Sequence[PostgresCommittable]) -> None:
        from sluice.sinks.postgres.committer import commit_all

        conn = connect(self.options)
        try:
            _check_server(conn, self.options)
            ensure_marker_table(conn, self.options)
            if self.options.table_schema is not None:
                ensure_table(conn, self.options, self.options.table_schema)
            if self.options.mode == "upsert" and exists(conn, self.options.table):
                conn.rollback()
                ensure_stage_table(conn, self.options)  # before any writer: no writer waits on another's DDL
            conn.rollback()
            named = {c.gid for c in committables}
            mine = gid_prefix(job_id, self.options.sink_key)
            db = conn.info.dbname
            orphans = [x for x in conn.tpc_recover() if x.gtrid.startswith(mine) and x.database == db
                       and x.gtrid not in named]  # fmt: skip
            conn.rollback()
            for x in orphans:
                conn.tpc_rollback(x.gtrid)
            if orphans:
                log.info("%s: rolled back %d prepared transaction(s) of checkpoints that never completed",
                         self.name, len(orphans))  # fmt: skip
            commit_all(conn, self.options, committables)
        finally:
            conn.close()


def _check_server(conn: Any, options: PostgresSinkOptions) -> None:
    """Two-phase commit needs ``max_prepared_transactions`` > 0 (PostgreSQL's default is 0)."""
    value = int(conn.execute("SHOW max_prepared_transactions").fetchone()[0])
    conn.rollback()
    if value <= 0:
        raise PostgresServerError(
            f"PostgresSink {options.table}: the server at {safe_target(options)} has max_prepared_transactions = "
            f"{value}, so it cannot prepare transactions: set it to at least twice the sink's parallelism in "
            "postgresql.conf and restart the server"
        )
