"""A full disk for the fault tier: a size-limited tmpfs, and ballast that fills it to the last byte.

``SmallDisk`` mounts ``tmpfs -o size=...`` (the tests run as root; a test that cannot mount FAILS, it never
skips: a skipped full-disk test would prove nothing). ``fill()`` writes a ballast file until the kernel
answers ENOSPC, so every later write of the job fails the same way; ``free()`` deletes it.
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from tests import listing

__all__ = ["SmallDisk"]

_CHUNK = 256 * 1024


class SmallDisk:
    """A tmpfs of ``size`` mounted at ``path`` (an empty folder it creates)."""

    def __init__(self, path: Path, size: str) -> None:
        self.path = path
        self.size = size
        self._ballast = path / ".ballast"
        self.mounted = False
        #: times fill() found the disk full (ENOSPC), as proof the fault was in place
        self.filled = 0

    def mount(self) -> SmallDisk:
        self.path.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.size},mode=0755", "tmpfs", str(self.path)],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        if r.returncode != 0:
            pytest.fail(
                f"cannot mount a {self.size} tmpfs at {self.path} (the full-disk tests need root and "
                f"mount(8)): {r.stderr.strip() or r.stdout.strip()}"
            )
        self.mounted = True
        return self

    def unmount(self) -> None:
        if not self.mounted:
            return
        r = subprocess.run(["umount", str(self.path)], capture_output=True, text=True, timeout=30)
        if r.returncode != 0:  # a thread of a job that failed may still hold a file open: detach it
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True, text=True, timeout=30)
        self.mounted = False

    def free_bytes(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def fill(self) -> None:
        """Write ballast until the disk is full (ENOSPC); keep what fits."""
        chunk = b"\0" * _CHUNK
        with open(self._ballast, "ab", buffering=0) as f:
            size = _CHUNK
            while size >= 1:
                try:
                    f.write(chunk[:size])
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    size //= 2
        assert self.free_bytes() == 0, f"{self.path}: {self.free_bytes()} bytes still free after filling"
        self.filled += 1

    def free(self) -> None:
        """Delete the ballast."""
        self._ballast.unlink(missing_ok=True)

    def files(self, under: str = "") -> list[Path]:
        """Every file under ``under`` (the ballast left out)."""
        return [p for p in listing.file_paths(self.path / under) if p != self._ballast]
