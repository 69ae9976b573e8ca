"""RocksDB working folders on local disk, each locked by the process that uses it.

A keyed backend's database lives in a folder of its own under ``StateBackendConfig.local_dir``; it is
deleted when the backend is disposed, but a process that is killed (SIGKILL, OOM, a lost container) never
disposes: its folders stay. A job restarted after every such crash would fill the disk with them (issue 39:
four folders per kill). So each folder holds a ``.owner`` file the process keeps an exclusive ``flock`` on
while it uses it (the kernel releases it when the process dies, however it dies), and a process that makes
a new folder first deletes the folders under the same base whose lock it can take: nobody uses them.
Folders without an owner file (not made by this module) are left alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import tempfile
import threading

__all__ = ["OWNER", "claim", "release", "sweep"]

log = logging.getLogger("sluice.state")

#: the lock file in every working folder
OWNER = ".owner"

_held: dict[str, int] = {}  # folder -> the descriptor holding its lock
_guard = threading.Lock()


def claim(base: str, prefix: str) -> str:
    """A new working folder under ``base`` (named ``<prefix><random>``), locked by this process until
    :func:`release`; folders under ``base`` that no live process holds are deleted first."""
    os.makedirs(base, exist_ok=True)
    sweep(base)
    root = tempfile.mkdtemp(prefix=prefix, dir=base)
    # locked under a temporary name, then renamed: a sweep never sees an owner file that is not locked yet
    tmp = os.path.join(root, f"{OWNER}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, f"{os.getpid()}\n".encode())
        os.rename(tmp, os.path.join(root, OWNER))
    except BaseException:
        os.close(fd)
        raise
    with _guard:
        _held[root] = fd
    return root


def release(root: str) -> None:
    """Give up the lock of a folder made by :func:`claim` (after it is deleted, or to leave it)."""
    with _guard:
        fd = _held.pop(root, None)
    if fd is not None:
        os.close(fd)


def sweep(base: str) -> list[str]:
    """Delete the working folders under ``base`` whose owner is gone; returns their paths."""
    gone: list[str] = []
    try:
        names = os.listdir(base)
    except FileNotFoundError:
        return gone
    for name in names:
        path = os.path.join(base, name)
        try:
            fd = os.open(os.path.join(path, OWNER), os.O_RDWR)
        except OSError:  # not a working folder of this module (or not readable): left alone
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live process uses it (this one too: a lock on another descriptor)
            shutil.rmtree(path, ignore_errors=True)
            gone.append(path)
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)
    if gone:
        log.info("deleted %d RocksDB working folder(s) left by processes that ended without cleaning up "
                 "under %s", len(gone), base)  # fmt: skip
    return gone
