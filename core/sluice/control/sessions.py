"""Browser sessions of the control endpoint: one-time login codes and session cookies, never the token.

A browser never holds the job's token. It logs in once, with a **login code** (``sluice dashboard JOB``
asks the endpoint for one with the token: random, single use, valid :data:`CODE_TTL` seconds) or with the
token typed into the login form, and gets a **session**: a random id in an HttpOnly, SameSite=Strict cookie
whose ``Path`` is the session's own random dashboard address ``/s/<random>/``. Cookies ignore ports, so a
cookie with ``Path=/`` would go to every other web service on the same host the browser visits; this one
is only sent to addresses under that random path, which nothing outside this endpoint and the browser
knows. The API accepts a session only as that cookie on that path, and the token only as a Bearer header:
neither works in the other's place.

Sessions and codes live in this process only (a table with expiry; the job's end ends them all); they
are kept by the SHA-256 of their value, so lookups do not depend on secret bytes. Not thread-safe: the
endpoint uses it from its event loop only.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

__all__ = ["CODE_TTL", "SESSION_COOKIE", "SESSION_TTL", "BrowserSessions", "Session"]

#: the session cookie's name
SESSION_COOKIE = "sluice_session"
#: how long a session lasts (seconds, from the login; then log in again)
SESSION_TTL = 8 * 3600.0
#: how long a login code can be used (seconds)
CODE_TTL = 120.0
_MAX_SESSIONS = 32
_MAX_CODES = 16

CodeState = Literal["pending", "used", "expired"]


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode()).digest()


@dataclass
class Session:
    """One browser's session.

    Attributes:
        path: Its dashboard's address and the cookie's ``Path``, e.g. ``/s/<random>/``.
        expires: When it ends (on the sessions' clock).
    """

    path: str
    expires: float


@dataclass
class _Code:
    expires: float
    used: bool = False


class BrowserSessions:
    """The endpoint's login codes and sessions.

    Args:
        ttl: How long a session lasts, in seconds.
        code_ttl: How long a login code can be used, in seconds.
        clock: Monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        ttl: float = SESSION_TTL,
        code_ttl: float = CODE_TTL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl = ttl
        self.code_ttl = code_ttl
        self._clock = clock
        self._sessions: dict[bytes, Session] = {}
        self._codes: dict[bytes, _Code] = {}

    # -- login codes -----------------------------------------------------------------------------------
    def new_code(self) -> str:
        """A new login code, valid :attr:`code_ttl` seconds, for one login."""
        self._prune()
        pending = [k for k, c in self._codes.items() if not c.used]
        for k in pending[: max(0, len(pending) - _MAX_CODES + 1)]:  # the oldest go first
            del self._codes[k]
        code = secrets.token_urlsafe(24)
        self._codes[_digest(code)] = _Code(self._clock() + self.code_ttl)
        return code

    def code_state(self, code: str) -> CodeState:
        """``pending`` until a browser used ``code``, then ``used``; ``expired`` once too old or unknown."""
        found = self._codes.get(_digest(code))
        if found is None or found.expires <= self._clock():
            return "expired"
        return "used" if found.used else "pending"

    def redeem(self, code: str) -> tuple[str, Session] | None:
        """A new session (id, session) for a valid, unused ``code`` (which is used up), else None."""
        found = self._codes.get(_digest(code))
        if found is None or found.used or found.expires <= self._clock():
            return None
        found.used = True  # kept until it expires, so code_state can say it was used
        return self.open()

    # -- sessions --------------------------------------------------------------------------------------
    def open(self) -> tuple[str, Session]:
        """A new session: (its id, for the cookie only; the session)."""
        self._prune()
        while len(self._sessions) >= _MAX_SESSIONS:
            del self._sessions[next(iter(self._sessions))]  # the oldest
        sid = secrets.token_urlsafe(32)
        session = Session(f"/s/{secrets.token_urlsafe(16)}/", self._clock() + self.ttl)
        self._sessions[_digest(sid)] = session
        return sid, session

    def find(self, sid: str | None, path: str) -> Session | None:
        """The live session ``sid`` whose address is ``path``, else None."""
        if not sid:
            return None
        session = self._sessions.get(_digest(sid))
        if session is None or session.expires <= self._clock():
            return None
        return session if secrets.compare_digest(session.path, path) else None

    def close(self, sid: str | None) -> None:
        """End session ``sid`` (log out)."""
        if sid:
            self._sessions.pop(_digest(sid), None)

    def max_age(self, session: Session) -> int:
        """Seconds the session has left (the cookie's ``Max-Age``)."""
        return max(0, math.ceil(session.expires - self._clock()))

    def _prune(self) -> None:
        now = self._clock()
        for k in [k for k, s in self._sessions.items() if s.expires <= now]:
            del self._sessions[k]
        for k in [k for k, c in self._codes.items() if c.expires <= now]:
            del self._codes[k]
