"""The options of :class:`~sluice.sinks.postgres.PostgresSink`: one frozen, validated model.

Connection settings are a libpq connection string (``host=... dbname=...`` or ``postgresql://...``) and an
optional ``password``; both are kept as secrets: never shown in ``repr``, logs or error messages
(:func:`safe_target` is what messages show instead: host, port, database, user).
"""

from __future__ import annotations

import re
from typing import Any, Literal

import pyarrow as pa
from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator
from sluice.config import _Frozen
from sluice.durations import to_seconds
from sluice.errors import ConfigError

__all__ = ["MODES", "PostgresSinkOptions", "connect", "redact", "safe_target", "split_name"]

MODES = ("append", "upsert")
#: a table, column or marker-table name: letters, digits, ``_`` and ``$``, optionally ``schema.name``
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,62}(\.[A-Za-z_][A-Za-z0-9_$]{0,62})?$")


def split_name(name: str) -> tuple[str, ...]:
    """``"schema.table"`` as ``("schema", "table")``, ``"table"`` as ``("table",)``."""
    return tuple(name.split("."))


class PostgresSinkOptions(_Frozen):
    """What a :class:`~sluice.sinks.postgres.PostgresSink` writes where, and how.

    Attributes:
        conninfo: a libpq connection string or URL (may hold a password: never shown).
        table: the target table, ``name`` or ``schema.name`` (used as given: quoted, case-sensitive).
        mode: ``"append"`` (``COPY`` into the table) or ``"upsert"`` (``INSERT ... ON CONFLICT`` on
            ``key_columns``: the last row of a key wins).
        key_columns: the columns of the table's primary key or unique index (upsert).
        table_schema: the table's Arrow schema: the table is created from it at start if missing, or
            checked. Without it the first batch's schema creates (or is checked against) the table.
        create_table: create a missing table (False: a missing table fails the job at start).
        marker_table: the table of commit markers (created if missing), ``name`` or ``schema.name``.
        sink_id: names this sink's transactions and markers; default: the table. Two sinks of one job
            writing the same table need different ids.
        password: the password, if not in ``conninfo`` (or use ``PGPASSWORD`` / ``~/.pgpass``).
        connect_timeout_s: bound on opening a connection.
        lock_timeout_s: bound on waiting for a lock while writing (a lock held by a prepared transaction
            of an attempt that never ends: fails instead of hanging).
        outage_timeout_s: how long the sink rides out a server it cannot reach (restarted, failing over, a
            network cut): each step is tried again on a new connection until then, and only a longer outage
            costs a job restart (:mod:`sluice.sinks.postgres.outage`); 0 = no waiting.
    """

    conninfo: SecretStr = Field(repr=False)
    table: str
    mode: Literal["append", "upsert"] = "append"
    key_columns: tuple[str, ...] = ()
    table_schema: pa.Schema | None = None
    create_table: bool = True
    marker_table: str = "sluice_sink_markers"
    sink_id: str | None = None
    password: SecretStr | None = Field(default=None, repr=False)
    connect_timeout_s: float = 10.0
    lock_timeout_s: float = 30.0
    outage_timeout_s: float = 30.0

    @field_validator("table", "marker_table")
    @classmethod
    def _name(cls, v: str) -> str:
        if not isinstance(v, str) or not _NAME.match(v):
            raise ConfigError(
                f"PostgresSink: table names must be 'name' or 'schema.name' (letters, digits, _ and $, at most "
                f"63 characters each; got {v!r})"
            )
        return v

    @field_validator("connect_timeout_s", "lock_timeout_s", mode="before")
    @classmethod
    def _duration(cls, v: Any, info: ValidationInfo) -> float:
        return to_seconds(v, f"PostgresSink: {info.field_name}", sign="any")

    @field_validator("key_columns", mode="before")
    @classmethod
    def _keys(cls, v: Any) -> Any:
        return (v,) if isinstance(v, str) else v

    @model_validator(mode="after")
    def _check(self) -> PostgresSinkOptions:
        try:
            from psycopg.conninfo import conninfo_to_dict
        except ImportError:  # pragma: no cover - the extra is installed with the tests
            raise ConfigError("PostgresSink needs psycopg 3: pip install 'sluice-etl[postgres]'") from None
        try:
            conninfo_to_dict(self.conninfo.get_secret_value())
        except Exception:
            raise ConfigError(
                "PostgresSink: conninfo is not a libpq connection string ('host=... dbname=...') nor a "
                "postgresql:// URL (its text is not shown: it may hold a password)"
            ) from None
        if self.mode == "upsert" and not self.key_columns:
            raise ConfigError(
                "PostgresSink: mode 'upsert' needs key_columns (the columns of the table's primary key or of a "
                "unique index)"
            )
        if self.mode == "append" and self.key_columns:
            raise ConfigError("PostgresSink: key_columns is for mode 'upsert' (mode is 'append')")
        if len(set(self.key_columns)) != len(self.key_columns) or any(not k for k in self.key_columns):
            raise ConfigError(
                f"PostgresSink: key_columns must be distinct column names (got {self.key_columns})"
            )
        if self.table_schema is not None:
            missing = [k for k in self.key_columns if k not in self.table_schema.names]
            if missing:
                raise ConfigError(
                    f"PostgresSink: key_columns {missing} are not in the schema ({self.table_schema.names})"
                )
        for opt in ("connect_timeout_s", "lock_timeout_s"):
            if not 0 < getattr(self, opt) < float("inf"):
                raise ConfigError(
                    f"PostgresSink: {opt} must be a finite duration > 0 (got {getattr(self, opt)!r})"
                )
        if not 0 <= self.outage_timeout_s < float("inf"):
            raise ConfigError(
                f"PostgresSink: outage_timeout_s must be a number of seconds >= 0 (got {self.outage_timeout_s!r})"
            )
        if self.sink_id is not None and not (0 < len(self.sink_id) <= 100 and ":" not in self.sink_id):
            raise ConfigError(
                f"PostgresSink: sink_id must be 1 to 100 characters without ':' (got {self.sink_id!r})"
            )
        return self

    @property
    def sink_key(self) -> str:
        """The id of this sink in transaction ids and marker rows."""
        return self.sink_id or self.table


def _params(options: PostgresSinkOptions) -> dict[str, str]:
    from psycopg.conninfo import conninfo_to_dict

    params = {k: str(v) for k, v in conninfo_to_dict(options.conninfo.get_secret_value()).items()}
    if options.password is not None:
        params["password"] = options.password.get_secret_value()
    return params


def safe_target(options: PostgresSinkOptions) -> str:
    """``user@host:port/dbname`` of the connection settings: what messages show (never a password)."""
    p = _params(options)
    host = p.get("host") or p.get("hostaddr") or "(default host)"
    port = f":{p['port']}" if p.get("port") else ""
    user = f"{p['user']}@" if p.get("user") else ""
    return f"{user}{host}{port}/{p.get('dbname', '(default database)')}"


def redact(text: str, options: PostgresSinkOptions) -> str:
    """``text`` with the password and the connection string replaced by ``***``."""
    secrets = [options.conninfo.get_secret_value(), _params(options).get("password", "")]
    for s in sorted(filter(None, secrets), key=len, reverse=True):
        text = text.replace(s, "***")
    return text


#: what the server says when it refuses a login for good (libpq gives no SQLSTATE for a failed connection)
_REFUSED = re.compile(
    r"authentication failed|no pg_hba\.conf entry|role \".*\" does not exist|database \".*\" does not exist"
    r"|certificate verify failed"
)


def connect(options: PostgresSinkOptions, autocommit: bool = False) -> Any:
    """A new psycopg connection (``lock_timeout`` set); connection errors come back with the password
    redacted, as a :class:`~sluice.sinks.postgres.errors.PostgresConnectionError`: transient (recoverable)
    when the server could not be reached, not recoverable when it refused the login or has no such
    database."""
    import psycopg
    from sluice.sinks.postgres.errors import PostgresConnectionError

    params: dict[str, Any] = _params(options)
    params.setdefault("application_name", "sluice")
    params.setdefault("connect_timeout", str(max(1, round(options.connect_timeout_s))))  # unless conninfo has one
    try:
        conn = psycopg.connect(autocommit=autocommit, **params)
    except psycopg.Error as exc:
        refused = bool(_REFUSED.search(str(exc)))
        hint = " (conninfo, password: check the user, password and database)" if refused else ""
        raise PostgresConnectionError(
            f"PostgresSink: cannot connect to {safe_target(options)}: {redact(str(exc), options).strip()}{hint}",
            transient=not refused,
        ) from None
    conn.execute(f"SET lock_timeout = {int(options.lock_timeout_s * 1000)}")
    if not autocommit:
        conn.commit()
    return conn
