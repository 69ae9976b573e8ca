"""The PostgreSQL sink's committer: ``COMMIT PREPARED`` of each committable (and the upsert merge), idempotent
through the marker rows (:func:`~sluice.sinks.postgres.transactions.commit_one`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sluice.errors import CommitError, SluiceError
from sluice.sink import CommitOutcome, Committer, SinkContext
from sluice.sinks.postgres.options import PostgresSinkOptions, connect, redact
from sluice.sinks.postgres.outage import is_transient, ride_out
from sluice.sinks.postgres.schema import table_columns
from sluice.sinks.postgres.transactions import PostgresCommittable, commit_one

__all__ = ["PostgresCommitter", "commit_all"]


def commit_all(
    conn: Any, options: PostgresSinkOptions, committables: Sequence[PostgresCommittable], ctx: Any = None
) -> int:
    """Commit ``committables`` in order; returns how many this call made visible."""
    columns: list[str] = []

    def target_columns() -> list[str]:
        if not columns:
            columns.extend(c for c, _, _ in table_columns(conn, options.table))
            conn.rollback()
        return columns

    hook = ctx.fault_hook if ctx is not None else (lambda _p: None)
    published = 0
    for c in committables:
        if commit_one(conn, options, c, target_columns, hook):
            published += 1
    return published


class PostgresCommitter(Committer[PostgresCommittable]):
    """Commits the prepared transactions of one subtask's completed checkpoints, oldest first."""

    def __init__(self, options: PostgresSinkOptions, ctx: SinkContext) -> None:
        self.options = options
        self.ctx = ctx
        self._conn: Any = None

    def commit(self, committables: Sequence[PostgresCommittable]) -> CommitOutcome:
        import psycopg

        if not committables:
            return CommitOutcome.COMMITTED

        def commit() -> int:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = connect(self.options)
                return commit_all(self._conn, self.options, committables, self.ctx)
            except Exception as exc:
                if is_transient(exc):
                    self._drop()  # a new connection on the next try (commit_one is idempotent)
                raise

        try:
            published = ride_out(self.options, "commit", commit)
        except (SluiceError, psycopg.Error) as exc:
            self._drop()
            if isinstance(exc, SluiceError):
                raise
            raise CommitError(
                f"PostgresSink {self.options.table}: commit failed: {redact(str(exc), self.options).strip()}"
            ) from None
        if published:
            self.ctx.metric("postgres_committed_transactions", published)
        return CommitOutcome.COMMITTED if published else CommitOutcome.ALREADY_COMMITTED

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass

    def close(self) -> None:
        self._drop()
