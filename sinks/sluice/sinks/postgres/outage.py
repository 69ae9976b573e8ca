"""Riding out a short PostgreSQL outage (a restart, a failover, a network cut) without a job restart.

As the Kafka source's ``broker_unavailable_timeout_s`` and the checkpoint storage's
``storage_retry_timeout``: a step of the sink that fails because the server cannot be reached (connection
refused or cut, the server shutting down or starting up) is tried again on a new connection, with
exponential backoff, for up to ``PostgresSink(outage_timeout_s=...)`` seconds; then the last error goes up
and the job restarts as before. Every step retried is idempotent: a pre-commit either prepared its
transaction (its id is found in ``pg_prepared_xacts`` and the retry stops there) or left nothing (an
unprepared transaction dies with its session), and a commit checks its marker row.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import tenacity
from sluice.sinks.postgres.errors import PostgresConnectionError
from sluice.sinks.postgres.options import PostgresSinkOptions, safe_target

__all__ = ["is_transient", "ride_out"]

log = logging.getLogger("sluice.sinks.postgres")

T = TypeVar("T")

#: SQLSTATEs of a server going away or coming back: admin / crash shutdown, cannot connect now
_TRANSIENT_STATES = ("57P01", "57P02", "57P03")


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` says the server could not be reached (connection class 08, a shutdown, a start-up, a
    connection closed under the client): worth a new connection. A refused login, a lock timeout, a bad
    statement are not."""
    import psycopg

    if isinstance(exc, PostgresConnectionError):
        return exc.transient
    if isinstance(exc, psycopg.InterfaceError):  # the connection is closed
        return True
    if isinstance(exc, psycopg.OperationalError):
        state = exc.sqlstate
        return state is None or state.startswith("08") or state in _TRANSIENT_STATES
    return False


def ride_out(options: PostgresSinkOptions, what: str, fn: Callable[[], T]) -> T:
    """``fn()``, called again while it fails with a transient error (:func:`is_transient`), for up to
    ``options.outage_timeout_s`` seconds (0: once); ``fn`` opens the connections it needs."""
    if options.outage_timeout_s <= 0:
        return fn()

    def waiting(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        log.warning(
            "PostgresSink %s: %s: %s unreachable (%s); trying again for up to %.0f s (outage_timeout_s)",
            options.table,
            what,
            safe_target(options),
            " ".join(str(exc).split())[:200],
            options.outage_timeout_s,
        )

    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_delay(options.outage_timeout_s),
        wait=tenacity.wait_exponential(multiplier=0.1, max=2.0),
        retry=tenacity.retry_if_exception(is_transient),
        before_sleep=waiting,
        reraise=True,
    )
    return retrying(fn)
