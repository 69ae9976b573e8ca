"""PostgreSQL sink: exactly-once rows through two-phase commit (one prepared transaction per writer subtask and
checkpoint), append by ``COPY`` or upsert by ``INSERT ... ON CONFLICT``.

Needs the ``sluice-etl[postgres]`` extra (psycopg 3) and a server with ``max_prepared_transactions`` above 0.
See ``docs/kafka_postgres.md``.
"""

from __future__ import annotations

from sluice.sinks.postgres.errors import PostgresDataLossError, PostgresSchemaError, PostgresServerError
from sluice.sinks.postgres.options import PostgresSinkOptions
from sluice.sinks.postgres.sink import PostgresSink

__all__ = [
    "PostgresDataLossError",
    "PostgresSchemaError",
    "PostgresServerError",
    "PostgresSink",
    "PostgresSinkOptions",
]
