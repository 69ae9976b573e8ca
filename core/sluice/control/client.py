"""The CLI's client of a job's control endpoint: find the job (registry or URL), authenticate, call.

Plain HTTP with the standard library (``urllib``): the CLI needs a few JSON requests, nothing more.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from typing import Any

from sluice.control.registry import RegistryEntry, read_entries, read_token
from sluice.errors import SluiceError

__all__ = ["TOKEN_ENV", "ControlClient", "ControlError", "check_entry", "find_job"]

#: an environment variable that may hold the token (instead of a token file)
TOKEN_ENV = "SLUICE_CONTROL_TOKEN"
_TOKEN = re.compile(r"[A-Za-z0-9_\-]{16,256}")


class ControlError(SluiceError):
    """A job's control endpoint could not be reached, refused the request, or the request failed; the
    message says which and what to do."""


def find_job(job_id: str | None, storage: str) -> RegistryEntry:
    """The running job ``job_id`` in the registry of checkpoint storage ``storage``; with no id, the one
    job that runs there.

    Raises:
        ControlError: no such running job there (the message lists those that run), or no id and not
            exactly one job running (the message names them, to pick one).
    """
    entries = read_entries(storage)
    running = [e for e in entries if e.running]
    if job_id is None:
        if len(running) == 1:
            return running[0]
        if not running:
            raise ControlError(
                f"no job runs in the registry of {storage}: pass --storage with the job's checkpoint storage, "
                "or --url with its endpoint"
            )
        names = ", ".join(sorted(e.job_id for e in running))
        raise ControlError(f"{len(running)} jobs run in the registry of {storage} ({names}): name one as JOB")
    for e in running:
        if e.job_id == job_id:
            return e
    ended = [e for e in entries if e.job_id == job_id]
    if ended:
        raise ControlError(
            f"job {job_id!r} is not running: it ended {ended[0].status or ''} (registry in {storage})"
        )
    names = ", ".join(sorted(e.job_id for e in running)) or "none"
    raise ControlError(
        f"no running job {job_id!r} in the registry of {storage} (running there: {names}); pass --storage "
        "with the job's checkpoint storage, or --url with its endpoint"
    )


def check_entry(entry: RegistryEntry, token: str, storage: str) -> None:
    """Refuse to send ``token`` to the URL of a registry entry that the token did not sign.

    Raises:
        ControlError: the entry was written by someone else than the job (anyone who can write the
            checkpoint storage can write an entry), or for another token.
    """
    if not entry.authentic(token):
        raise ControlError(
            f"the registry entry of job {entry.job_id!r} in {storage} is not signed with the job's token: "
            f"it was not written by the job (or the token is another job's), so the token is not sent to "
            f"{entry.url!r}; pass --url and --token-file if you trust that endpoint"
        )


class ControlClient:
    """Calls one job's control endpoint.

    Args:
        url: The endpoint, e.g. ``http://127.0.0.1:41234``.
        token: The job's token.
    """

    def __init__(self, url: str, token: str) -> None:
        self.url = url.rstrip("/")
        self._token = token

    @classmethod
    def connect(
        cls, job_id: str | None, storage: str, url: str | None = None, token_file: str | None = None
    ) -> ControlClient:
        """A client for ``job_id`` (None: the one job that runs) found in ``storage``'s registry, or at
        ``url``; the token comes from
        ``token_file``, else :data:`TOKEN_ENV`, else the token file the registry names."""
        entry = None
        if url is None:
            entry = find_job(job_id, storage)
            url = entry.url
        token = os.environ.get(TOKEN_ENV) if token_file is None else None
        path = token_file or (entry.token_file if entry is not None else None)
        if token is None:
            if path is None:
                raise ControlError(f"with --url, give the job's token with --token-file or ${TOKEN_ENV}")
            try:
                token = read_token(path)
            except (OSError, UnicodeDecodeError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) else "not text"
                raise ControlError(
                    f"cannot read the job's token file {path}: {reason}; run as the user who started the "
                    f"job, or pass --token-file / ${TOKEN_ENV}"
                ) from exc
        if not _TOKEN.fullmatch(token):
            raise ControlError(
                f"{path or '$' + TOKEN_ENV} does not hold a job token (one line of URL-safe characters)"
            )
        if entry is not None:
            check_entry(entry, token, storage)
        return cls(url, token)

    def login_code(self) -> dict[str, Any]:
        """A new one-time login code for a browser: ``{"code", "login_url", "expires_in_s"}``; opening
        ``login_url`` logs a browser in once, within ``expires_in_s`` seconds (the token stays here)."""
        return self.post("/api/v1/login-codes", timeout=10.0)  # type: ignore[no-any-return]

    def get(self, path: str, timeout: float = 10.0) -> Any:
        """GET ``path`` (JSON)."""
        return self._call("GET", path, None, timeout)

    def post(self, path: str, body: dict[str, Any] | None = None, timeout: float = 660.0) -> Any:
        """POST ``body`` to ``path`` (JSON)."""
        return self._call("POST", path, body or {}, timeout)

    def text(self, path: str, timeout: float = 10.0) -> str:
        """GET ``path`` as text (``/metrics``)."""
        return str(self._call("GET", path, None, timeout, raw=True))

    def _call(
        self, method: str, path: str, body: dict[str, Any] | None, timeout: float, raw: bool = False
    ) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {self._token}"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                payload = resp.read()
        except urllib.error.HTTPError as exc:
            try:
                message = json.loads(exc.read()).get("error") or exc.reason
            except ValueError:
                message = exc.reason
            raise ControlError(f"{self.url}: {message}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ControlError(
                f"{self.url} does not answer ({reason}): the job may have ended (see `sluice jobs`)"
            ) from None
        return payload.decode() if raw else json.loads(payload)
