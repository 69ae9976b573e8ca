"""Fixtures of the checkpoint fault tests: a small tmpfs (a disk that can be filled, or mounted read-only)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """``tmpfs(size="1m", ro=False)`` mounts a tmpfs under the test's folder and returns where; unmounted
    after the test. A machine that cannot mount one fails the test (it is a part the test needs)."""
    mounts: list[Path] = []

    def mount(size: str = "1m", ro: bool = False) -> Path:
        where = tmp_path / f"tmpfs-{len(mounts)}"
        where.mkdir()
        opts = f"size={size}" + (",ro" if ro else "")
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)], capture_output=True, text=True)
        assert r.returncode == 0, f"cannot mount a tmpfs (the test needs one; run as root): {r.stderr}"
        mounts.append(where)
        return where

    yield mount
    for where in reversed(mounts):
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(directory: Path) -> Path:
    """Fill the file system of ``directory`` up: a file that grows until the disk is full."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    return filler
