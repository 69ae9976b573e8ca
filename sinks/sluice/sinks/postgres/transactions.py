"""Prepared transactions of the PostgreSQL sink: their ids, the committable naming one, its commit and the
recovery of a restored job (DB-API two-phase commit: ``tpc_begin`` / ``tpc_prepare`` / ``tpc_commit`` /
``tpc_rollback`` / ``tpc_recover``).

A transaction id (PostgreSQL's ``gid``) is ``sluice:<job>:<sink>:<subtask>:<checkpoint>:a<attempt>``: unique
per job, sink, writer subtask, checkpoint and attempt (when the job and sink names make it longer than
PostgreSQL's 199 characters, they are replaced by a hash). The prepared transaction holds the checkpoint's
rows and one marker row ``(job, sink, subtask, checkpoint)``. ``COMMIT PREPARED`` of a transaction that is
no longer prepared fails with SQLSTATE 42704 whether it was committed or rolled back: the marker row
decides. Marker rows are pruned after each commit (rows of the same writer subtask with older checkpoints):
a writer subtask's checkpoints commit in order, so a marker of a later checkpoint also proves an earlier
one committed.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sluice.serializers import JsonSerializer
from sluice.sinks.postgres.errors import PostgresDataLossError
from sluice.sinks.postgres.options import PostgresSinkOptions
from sluice.sinks.postgres.schema import STAGE_GID, STAGE_SEQ, ident, stage_name

__all__ = [
    "PostgresCommittable",
    "PostgresCommittableSerializer",
    "commit_one",
    "gid_prefix",
    "make_gid",
    "marker_state",
]

log = logging.getLogger("sluice.sinks.postgres")

_GID_MAX = 199


def gid_prefix(job_id: str, sink: str) -> str:
    """The start of every transaction id of ``sink`` in ``job_id`` (a hash when the names are long)."""
    plain = f"sluice:{job_id}:{sink}:"
    if len(plain) <= _GID_MAX - 40:
        return plain
    return f"sluice:h{hashlib.sha256(f'{job_id}:{sink}'.encode()).hexdigest()[:32]}:"


def make_gid(job_id: str, sink: str, subtask: int, checkpoint_id: int, attempt: int) -> str:
    """The transaction id of a writer subtask's pre-commit of ``checkpoint_id`` in ``attempt``."""
    return f"{gid_prefix(job_id, sink)}{subtask}:{checkpoint_id}:a{attempt}"


@dataclass(frozen=True)
class PostgresCommittable:
    """A prepared transaction holding a writer subtask's rows of one checkpoint (goes into the checkpoint).

    Attributes:
        gid: the prepared transaction's id.
        job_id: the job whose writer prepared it.
        subtask: the writer subtask (its marker rows are keyed by it, wherever the commit runs).
        checkpoint_id: the checkpoint whose pre-commit prepared it.
        rows: rows it holds.
    """

    gid: str
    job_id: str
    subtask: int
    checkpoint_id: int
    rows: int


class PostgresCommittableSerializer(JsonSerializer[PostgresCommittable]):
    """A prepared transaction's id and where it came from, as JSON."""

    def to_json(self, obj: PostgresCommittable) -> Any:
        return {"gid": obj.gid, "job": obj.job_id, "subtask": obj.subtask, "checkpoint": obj.checkpoint_id,
                "rows": obj.rows}  # fmt: skip

    def from_json(self, version: int, value: Any) -> PostgresCommittable:
        return PostgresCommittable(
            str(value["gid"]),
            str(value["job"]),
            int(value["subtask"]),
            int(value["checkpoint"]),
            int(value["rows"]),
        )


def marker_state(conn: Any, options: PostgresSinkOptions, c: PostgresCommittable) -> tuple[bool, bool]:
    """``(committed, merged)`` of ``c`` according to the marker table (read in ``conn``'s transaction)."""
    from psycopg import sql

    row = conn.execute(
        sql.SQL(
            "SELECT checkpoint, merged FROM {} WHERE job = %s AND sink = %s AND subtask = %s AND checkpoint >= %s "
            "ORDER BY checkpoint LIMIT 1"
        ).format(ident(options.marker_table)),
        (c.job_id, options.sink_key, c.subtask, c.checkpoint_id),
    ).fetchone()
    if row is None:
        return False, False
    return True, bool(row[1]) or int(row[0]) > c.checkpoint_id


def _merge(conn: Any, options: PostgresSinkOptions, c: PostgresCommittable, columns: Sequence[str]) -> None:
    """Upsert: move ``c``'s staged rows into the table (the last row of a key wins), in key order so that
    concurrent merges take their row locks in one order; mark it merged; all in one transaction."""
    from psycopg import sql

    keys = sql.SQL(", ").join(sql.Identifier(k) for k in options.key_columns)
    cols = sql.SQL(", ").join(sql.Identifier(k) for k in columns)
    rest = [k for k in columns if k not in options.key_columns]
    action = (
        sql.SQL("DO UPDATE SET {}").format(
            sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(k)) for k in rest)
        )
        if rest
        else sql.SQL("DO NOTHING")
    )
    with conn.transaction():
        conn.execute(
            sql.SQL(
                "INSERT INTO {t} ({cols}) SELECT DISTINCT ON ({keys}) {cols} FROM {s} WHERE {gid} = %s "
                "ORDER BY {keys}, {seq} DESC ON CONFLICT ({keys}) {action}"
            ).format(
                t=ident(options.table),
                cols=cols,
                keys=keys,
                s=ident(stage_name(options)),
                gid=sql.Identifier(STAGE_GID),
                seq=sql.Identifier(STAGE_SEQ),
                action=action,
            ),
            (c.gid,),
        )
        conn.execute(
            sql.SQL("DELETE FROM {} WHERE {} = %s").format(
                ident(stage_name(options)), sql.Identifier(STAGE_GID)
            ),
            (c.gid,),
        )
        conn.execute(
            sql.SQL(
                "UPDATE {} SET merged = true WHERE job = %s AND sink = %s AND subtask = %s AND checkpoint = %s"
            ).format(ident(options.marker_table)),
            (c.job_id, options.sink_key, c.subtask, c.checkpoint_id),
        )


def _prune(conn: Any, options: PostgresSinkOptions, c: PostgresCommittable) -> None:
    from psycopg import sql

    with conn.transaction():
        conn.execute(
            sql.SQL(
                "DELETE FROM {} WHERE job = %s AND sink = %s AND subtask = %s AND checkpoint < %s"
            ).format(ident(options.marker_table)),
            (c.job_id, options.sink_key, c.subtask, c.checkpoint_id),
        )


def commit_one(
    conn: Any,
    options: PostgresSinkOptions,
    c: PostgresCommittable,
    columns: Callable[[], Sequence[str]],
    hook: Callable[[str], None] = lambda _p: None,
) -> bool:
    """Commit ``c`` (and, for upsert, merge its rows); True if this call made rows visible, False if they
    were already. ``conn`` is not in autocommit mode and not in a transaction. ``columns()`` gives the
    target table's columns (upsert only). Raises PostgresDataLossError if ``c``'s transaction was rolled back.
    """
    import psycopg

    published = False
    try:
        conn.tpc_commit(c.gid)
        published = True
    except psycopg.errors.UndefinedObject:  # 42704: not prepared any more: committed, or rolled back
        conn.rollback()
    if published:
        hook("commit")  # in the middle of a commit: committed; an upsert's rows are merged below
    committed, merged = marker_state(conn, options, c)
    conn.rollback()
    if not committed:
        raise PostgresDataLossError(
            f"PostgresSink {options.table}: prepared transaction {c.gid} of completed checkpoint "
            f"{c.checkpoint_id} is gone and its marker row is not in {options.marker_table}: it was rolled "
            f"back outside the sink, and its {c.rows} row(s) are lost. Restore an earlier checkpoint with "
            "allow_reprocessing to write them again"
        )
    if options.mode == "upsert" and not merged:
        _merge(conn, options, c, columns())
        published = True
    _prune(conn, options, c)
    return published
