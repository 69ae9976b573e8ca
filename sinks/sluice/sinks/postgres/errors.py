"""Errors of the PostgreSQL sink, under :class:`~sluice.errors.SluiceError`::

SluiceError
├── PostgresConnectionError   the server cannot be reached, or refused the login (names the target)
├── ConfigError
│   ├── PostgresSchemaError   the stream's schema does not fit the table (names both schemas)
│   └── PostgresServerError   the server cannot do two-phase commit (max_prepared_transactions = 0)
└── CommitError
    └── PostgresDataLossError a completed checkpoint's prepared transaction was rolled back by someone else
"""

from __future__ import annotations

from sluice.errors import CommitError, ConfigError, SluiceError

__all__ = ["PostgresConnectionError", "PostgresDataLossError", "PostgresSchemaError", "PostgresServerError"]


class PostgresConnectionError(SluiceError):
    """A connection could not be opened (the message names ``user@host:port/db``, never the password).

    Attributes:
        transient: the server was unreachable, shutting down or starting up: waiting may cure it (within
            ``outage_timeout_s``, then a restart). Otherwise (a refused login, a missing database) it is not
            ``recoverable``: the job fails at once.
    """

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message, recoverable=None if transient else False)
        self.transient = transient


class PostgresSchemaError(ConfigError):
    """The stream's schema does not fit the table's; the message shows both. Cast or select columns before
    the sink, or alter the table."""


class PostgresServerError(ConfigError):
    """The server is not set up for the sink (e.g. ``max_prepared_transactions`` is 0): a restart cannot
    cure it; the message says which setting to change."""


class PostgresDataLossError(CommitError):
    """A prepared transaction that a completed checkpoint names is gone and its marker row is not in the
    table: someone rolled it back (``ROLLBACK PREPARED`` by hand, or another tool). Its rows are lost; a
    restart cannot bring them back (``recoverable`` is False)."""

    recoverable = False
