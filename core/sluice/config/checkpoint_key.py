"""The checkpoint key: the secret that authenticates every checkpoint file a job writes (HMAC-SHA256,
:mod:`sluice.checkpoint.signing`).

The key is the job's, never the storage's: whoever can write the checkpoint storage cannot sign a file, so
a restore refuses anything the job's key did not sign, before decoding a byte of it. Where the key comes
from, first match wins:

1. ``CheckpointConfig(key=...)``;
2. the environment variable ``SLUICE_CHECKPOINT_KEY``;
3. the user's key file ``$XDG_CONFIG_HOME/sluice/checkpoint.key`` (``~/.config/sluice/checkpoint.key``),
   created with 32 random bytes and mode 0600 the first time a job needs it.

``Pipeline`` resolves the key on the driver when it builds the job's configuration, which the Spark runtime
ships to the executors with the job (as it ships the data plane's per-job secret), so executors never read
or create a key file of their own. A savepoint restores elsewhere only with the same key.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from sluice.errors import ConfigError

__all__ = ["KEY_ENV", "MIN_KEY_LENGTH", "default_key_file", "resolve_key"]

#: the environment variable that may hold the checkpoint key
KEY_ENV = "SLUICE_CHECKPOINT_KEY"
#: the shortest key accepted (characters)
MIN_KEY_LENGTH = 16


def default_key_file() -> Path:
    """``$XDG_CONFIG_HOME/sluice/checkpoint.key``, else ``~/.config/sluice/checkpoint.key``."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "sluice" / "checkpoint.key"


def resolve_key(configured: str | None = None) -> bytes:
    """The checkpoint key: ``configured``, else ``$SLUICE_CHECKPOINT_KEY``, else the user's key file
    (created if missing).

    Raises:
        ConfigError: the key is too short, or the key file cannot be read or is open to other users.
    """
    if configured is not None:
        return _checked(configured, "CheckpointConfig.key")
    env = os.environ.get(KEY_ENV)
    if env:
        return _checked(env, f"${KEY_ENV}")
    return _from_file(default_key_file())


def _checked(text: str, where: str) -> bytes:
    text = text.strip()
    if len(text) < MIN_KEY_LENGTH:
        raise ConfigError(
            f"{where}: a checkpoint key needs at least {MIN_KEY_LENGTH} characters (got {len(text)}); "
            'generate one with: python -c "import secrets; print(secrets.token_urlsafe(32))"'
        )
    return text.encode()


def _from_file(path: Path) -> bytes:
    if not path.exists():
        _create(path)
    try:
        st = path.stat()
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(
                f"checkpoint key file {path} is open to other users (mode {stat.S_IMODE(st.st_mode):o}): "
                f"run chmod 600 {path}"
            )
        return _checked(path.read_text(), f"checkpoint key file {path}")
    except OSError as exc:
        raise ConfigError(
            f"cannot read the checkpoint key file {path}: {exc.strerror}; set ${KEY_ENV} or "
            "CheckpointConfig(key=...) instead"
        ) from exc


def _create(path: Path) -> None:
    """Write a new random key to ``path`` (mode 0600) unless another process just did."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
        try:
            os.link(tmp, path)  # atomic and never replaces: a concurrent creator's key wins, whole
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    except OSError as exc:
        raise ConfigError(
            f"cannot create the checkpoint key file {path}: {exc.strerror}; set ${KEY_ENV} or "
            "CheckpointConfig(key=...) instead"
        ) from exc
