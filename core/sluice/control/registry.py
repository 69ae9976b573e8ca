"""How the CLI finds running jobs: a registry entry next to each job's checkpoints, and the job's token file.

A job that serves a control endpoint writes ``<checkpoint storage>/<job id>/_control.json`` (atomically,
on any checkpoint storage: local or S3) with its URL, its process and where its token file is; when it
ends it rewrites the entry with its final status, so ``sluice jobs`` never lists a job that ended. If
that rewrite fails (a full disk), the entry is deleted instead; and an entry whose process is gone from
this host (killed) reads as ended (status ``gone``). The token lives in a file only the user can read
(mode 0600): next to the entry for local storage, else in ``~/.sluice/tokens/``. The entry never holds
the token.

Whoever can write the checkpoint storage can write an entry too, so an entry is signed: ``mac`` is an
HMAC-SHA256 of its other fields keyed with the job's token. The CLI sends a token only to the URL of an
entry that token signed (:meth:`RegistryEntry.authentic`): a forged or altered entry cannot steer the
token elsewhere, and an entry naming someone else's token file gets nothing (its writer cannot sign with
a token it cannot read).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sluice.checkpoint.storage import CheckpointStorage, LocalCheckpointStorage
from sluice.checkpoint.storage_loader import checkpoint_storage
from sluice.errors import ConfigError

__all__ = [
    "ENTRY",
    "RegistryEntry",
    "parse_address",
    "read_entries",
    "read_token",
    "token_path",
    "write_token",
]

log = logging.getLogger("sluice.control")

#: the registry entry's name in a job's checkpoint directory
ENTRY = "_control.json"
_TOKEN = "_control.token"


def parse_address(value: str, option: str = "control_endpoint") -> tuple[str, int]:
    """Split ``HOST:PORT`` (``[::1]:PORT`` for IPv6; port 0 picks a free one) or raise ConfigError."""
    host, sep, port = value.rpartition(":") if isinstance(value, str) else ("", "", "")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(
            f"{option}: expected HOST:PORT such as 127.0.0.1:0 (port 0 picks a free port; 0.0.0.0 listens "
            f"on every interface), or None to serve no endpoint (got {value!r})"
        )
    return host, int(port)


@dataclass(frozen=True)
class RegistryEntry:
    """A running job as the registry records it.

    Attributes:
        job_id: The job.
        url: Its control endpoint, e.g. ``http://127.0.0.1:41234``.
        pid: The driver process.
        host: The driver's host name.
        started_at: When the job started (epoch seconds).
        runtime: ``local`` or ``spark``.
        token_file: The file holding the endpoint's token (readable by its user only).
        ended_at: When the job ended, or None while it runs.
        status: Its final status once it ended.
        attempt: Its last attempt (0 = no restart) once it ended.
        last_checkpoint: The id of its last completed checkpoint once it ended, if any.
        mac: HMAC-SHA256 (hex) of the other fields, keyed with the job's token.
    """

    job_id: str
    url: str
    pid: int
    host: str
    started_at: float
    runtime: str
    token_file: str
    ended_at: float | None = None
    status: str | None = None
    attempt: int | None = None
    last_checkpoint: int | None = None
    mac: str = ""

    @property
    def running(self) -> bool:
        return self.ended_at is None

    def ended(
        self, status: str, token: str, attempt: int | None = None, last_checkpoint: int | None = None
    ) -> RegistryEntry:
        """The entry of the same job once it ended with ``status`` (in ``attempt``, at ``last_checkpoint``),
        signed with ``token``."""
        ended = {"ended_at": time.time(), "status": status, "attempt": attempt, "last_checkpoint": last_checkpoint}
        return RegistryEntry(**{**asdict(self), **ended}).signed(token)

    def signed(self, token: str) -> RegistryEntry:
        """This entry with its ``mac`` computed with the job's ``token``."""
        return RegistryEntry(**{**asdict(self), "mac": self._mac(token)})

    def authentic(self, token: str) -> bool:
        """Whether ``token`` signed this entry (only then may the token go to :attr:`url`)."""
        return bool(self.mac) and hmac.compare_digest(self.mac, self._mac(token))

    def _mac(self, token: str) -> str:
        fields = {k: v for k, v in asdict(self).items() if k != "mac"}
        body = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
        return hmac.new(token.encode(), b"sluice registry entry\n" + body, hashlib.sha256).hexdigest()

    def write(self, storage: CheckpointStorage) -> None:
        """Write (or replace) the entry in the job's directory of ``storage``, atomically
        (:meth:`~sluice.checkpoint.storage.CheckpointStorage.replace`: a rename on a file system, a put on
        an object store).

        An ended entry that cannot be written is deleted instead, so it never reads as running; only if
        that fails too is the write's error raised.
        """
        path, data = f"{storage.job_dir()}/{ENTRY}", json.dumps(asdict(self), indent=1).encode()
        try:
            storage.retrying("write the registry entry", storage.replace, path, data)
        except Exception:
            if self.running:
                raise
            try:
                storage.delete_file(path)
            except Exception:
                log.warning("could not delete the registry entry %s either", path, exc_info=True)
                raise
            log.warning("could not mark the registry entry %s ended: deleted it instead", path, exc_info=True)

    @staticmethod
    def new(job_id: str, url: str, runtime: str, token_file: str, token: str) -> RegistryEntry:
        """The entry of a job starting now in this process, signed with its ``token``."""
        entry = RegistryEntry(job_id, url, os.getpid(), socket.gethostname(), time.time(), runtime, token_file)
        return entry.signed(token)


def read_entries(storage_uri: str, storage_options: dict[str, Any] | None = None) -> list[RegistryEntry]:
    """Every job's registry entry under checkpoint storage ``storage_uri`` (running or ended), by job id."""
    root = checkpoint_storage(storage_uri, "_", **(storage_options or {}))
    out = []
    # not jobs(): a job registers before its first checkpoint
    for job_id in root.retrying("list jobs", root.list_dirs, root.base):
        st = checkpoint_storage(storage_uri, job_id, **(storage_options or {}))
        path = f"{st.job_dir()}/{ENTRY}"
        try:
            entry = RegistryEntry(**json.loads(st.retrying("read the registry entry", st.read_file, path)))
        except (ValueError, TypeError, FileNotFoundError, NotADirectoryError):
            continue  # a half-written or foreign file (or deleted meanwhile): not an entry
        if entry.running and entry.host == socket.gethostname() and not _alive(entry.pid):
            entry = RegistryEntry(**{**asdict(entry), "ended_at": entry.started_at, "status": "gone"})
        out.append(entry)
    return out


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def token_path(storage: CheckpointStorage) -> Path:
    """Where a job's token file goes: next to its registry entry on local storage, else in the user's
    ``~/.sluice/tokens``."""
    if isinstance(storage, LocalCheckpointStorage):
        return Path(storage.job_dir()) / _TOKEN
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in storage.job_id)
    return Path.home() / ".sluice" / "tokens" / f"{safe}.token"


def write_token(path: Path) -> str:
    """Create a new random token in ``path``, readable and writable by this user only (mode 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.parent.name == "tokens":
        os.chmod(path.parent, 0o700)
    path.unlink(missing_ok=True)  # a file left by an earlier run: replaced, never reused
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)
    return token


def read_token(path: str | Path) -> str:
    """The token in ``path`` (OSError if it cannot be read, e.g. it belongs to another user)."""
    return Path(path).read_text().strip()
